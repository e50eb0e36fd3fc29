//! Decoding a payload by the schema its envelope references (feature `registry`), as the Go
//! client's `Resolver.ForEnvelope` and `Schema.Decode` do (docs/sdk-rust.md, "Schema registry").
//!
//! The envelope is producer-controlled, so its reference is checked before it is used: it may
//! only name the topic's own subject (`<topic>` or `<topic>-value`, or subjects the caller
//! passes), and a `schema_hash` must be the fetched version's - a reference cannot borrow
//! another subject's schema or swap its content.
//!
//! A protobuf schema is read from the registry in Confluent's serialized form (base64 of its
//! `FileDescriptorProto`, `?format=serialized`), decoded with prost-types - no `.proto` parser
//! in the crate. The payload is decoded as the message the envelope's `schema_name` names (or
//! the file's first message): the wire format (`application/protobuf`, `application/x-protobuf`)
//! field by field, or JSON (the protobuf JSON mapping: every key must be a field of the message,
//! by its name or JSON name, with a value of the field's type). Either gives the message as JSON
//! with the fields' proto names. A JSON Schema validates a JSON payload
//! ([`validate_json`](crate::registry::validate_json)); an Avro schema decodes binary Avro
//! ([`crate::avro`]). [`validate_protobuf`] is the protobuf check before publish.

use base64::Engine;
use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FieldDescriptorProto, FileDescriptorProto};
use serde_json::{Map, Value};

use crate::error::{err, Result};
use crate::model::Envelope;
use crate::registry::RegistryClient;
use crate::wire;

mod wkt;
pub use wkt::{duration_string, timestamp_string};

/// What an envelope's schema context points at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchemaRef {
    /// `.../subjects/<subject>/versions/<n>`
    SubjectVersion {
        subject: String,
        version: i64,
        hash: String,
    },
    /// `.../schemas/ids/<id>` or `/v1/schemas/<id>`, or the extension `schema.id`
    Id { id: i64, hash: String },
}

/// The schema a payload was decoded by.
#[derive(Debug, Clone)]
pub struct ResolvedSchema {
    pub subject: String,
    pub version: i64,
    /// `protobuf`, `json` or `avro` (Prism's names).
    pub format: String,
    pub hash: String,
    pub text: String,
    /// The protobuf schema's file descriptor (None for other formats).
    pub descriptor: Option<FileDescriptorProto>,
    /// The files a protobuf schema imports through its Confluent `references`, transitively,
    /// each named by its import path (`common/money.proto`); their messages are found by full
    /// name beside the schema's own. Empty for other formats and schemas without references.
    pub imports: Vec<FileDescriptorProto>,
    /// An Avro schema's referenced schema texts (its Confluent `references`, transitively,
    /// dependencies first); empty for other formats.
    pub references: Vec<String>,
}

fn ref_err(what: String, at: &str, hint: &str) -> crate::PrismError {
    err!(Registry, what, at, hint)
}

fn clip(s: &str) -> String {
    s.chars().take(200).collect()
}

/// The reference in `env`'s schema context (what Go's `RefOf` reads).
pub fn schema_ref(env: &Envelope) -> Result<SchemaRef> {
    let sc = env.header.schema.clone().unwrap_or_default();
    let (raw, hash) = (sc.schema_url, sc.schema_hash);
    let path = match raw.find("://") {
        Some(i) => {
            let rest = &raw[i + 3..];
            let p = rest.find('/').map(|j| &rest[j..]).unwrap_or("");
            p.split(['?', '#']).next().unwrap_or("").to_owned()
        }
        None => raw.clone(),
    };
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    let n = parts.len();
    if n >= 4 && parts[n - 4] == "subjects" && parts[n - 2] == "versions" {
        if let (Some(subject), Ok(version)) = (percent_decode(parts[n - 3]), parts[n - 1].parse::<i64>()) {
            if parts[n - 1].bytes().all(|b| b.is_ascii_digit()) {
                return Ok(SchemaRef::SubjectVersion { subject, version, hash });
            }
        }
    }
    let by_path = if n >= 3
        && ((parts[n - 3] == "v1" && parts[n - 2] == "schemas") || (parts[n - 3] == "schemas" && parts[n - 2] == "ids"))
    {
        Some(parts[n - 1].to_owned())
    } else {
        None
    };
    let text = by_path.or_else(|| {
        env.header
            .extensions
            .get("schema.id")
            .map(|b| String::from_utf8_lossy(b).trim().to_owned())
    });
    if let Some(id) = text
        .filter(|t| t.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|t| t.parse::<i64>().ok())
    {
        if id > 0 && id < 1 << 31 {
            return Ok(SchemaRef::Id { id, hash });
        }
    }
    Err(ref_err(
        format!(
            "message {} names no registered schema (schema_url {:?})",
            env.message_id(),
            clip(&raw)
        ),
        "schema.schema_url",
        "the producer or the worker's enrich stage must stamp a registry schema (subject version or id)",
    ))
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

impl RegistryClient {
    /// `GET /subjects/<subject>/versions/<version>?format=serialized`: the version with its
    /// schema as a base64 `FileDescriptorProto`.
    fn serialized_version(&self, subject: &str, version: i64) -> Result<serde_json::Value> {
        self.request_value(
            "GET",
            &format!(
                "/subjects/{}/versions/{version}?format=serialized",
                crate::registry::segment(subject)
            ),
        )
    }

    /// A protobuf version's `FileDescriptorProto`, read in Confluent's serialized form
    /// (`?format=serialized`, base64). Its imports are not fetched: see
    /// [`protobuf_descriptors`](Self::protobuf_descriptors).
    pub fn serialized_descriptor(&self, subject: &str, version: i64) -> Result<FileDescriptorProto> {
        let ser = self.serialized_version(subject, version)?;
        descriptor_of(&ser, "schema")
    }

    /// A protobuf version's `FileDescriptorProto` and the files it imports through its
    /// Confluent `references` (`{name, subject, version}`, `name` the import path), fetched
    /// transitively in the serialized form, as the registry hands them to protoc: each imported
    /// file is named by its import path, dependencies first. Bounded as every reference walk
    /// ([`crate::registry::MAX_REFERENCE_DEPTH`], [`crate::registry::MAX_REFERENCES`],
    /// [`crate::registry::MAX_REFERENCED_BYTES`], cycles refused). Every import of every file
    /// must be one of that file's references (or a file the registry provides itself:
    /// `google/protobuf/*`, `prism/annotations.proto`), and import paths must be relative
    /// paths without `.`/`..` segments. Each failure is `PrismError::Registry` at
    /// `schema.references`.
    pub fn protobuf_descriptors(
        &self,
        subject: &str,
        version: i64,
    ) -> Result<(FileDescriptorProto, Vec<FileDescriptorProto>)> {
        let ser = self.serialized_version(subject, version)?;
        let main = descriptor_of(&ser, "schema")?;
        check_imports(&main, &ser, "schema")?;
        let mut imports = Vec::new();
        for r in self.referenced_versions(&ser, "?format=serialized")? {
            let at = format!("reference {:?} ({} v{})", r.name, r.subject, r.version);
            let mut file = descriptor_of(&r.doc, &at)?;
            check_imports(&file, &r.doc, &at)?;
            file.name = Some(r.name);
            imports.push(file);
        }
        Ok((main, imports))
    }

    /// The schema `env` references, after the checks of the module docs. `subjects` are the
    /// subjects accepted (empty: the topic and `<topic>-value`).
    pub fn resolve_for_envelope(&self, env: &Envelope, subjects: &[&str]) -> Result<ResolvedSchema> {
        let topic = env.topic();
        let default = [topic.to_owned(), format!("{topic}-value")];
        let allowed: Vec<&str> = if subjects.is_empty() {
            default.iter().map(String::as_str).collect()
        } else {
            subjects.to_vec()
        };
        let id = env.message_id();
        let (subject, version, claimed) = match schema_ref(env)? {
            SchemaRef::SubjectVersion { subject, version, hash } => (subject, version, hash),
            SchemaRef::Id { id: sid, hash } => {
                let under = self.request_value("GET", &format!("/schemas/ids/{sid}/versions"))?;
                let found = under.as_array().into_iter().flatten().find_map(|sv| {
                    let s = sv.get("subject")?.as_str()?;
                    let v = sv.get("version")?.as_i64()?;
                    allowed.contains(&s).then(|| (s.to_owned(), v))
                });
                match found {
                    Some((s, v)) => (s, v, hash),
                    _ => {
                        return Err(ref_err(
                            format!("message {id} on topic {topic:?} references schema id {sid}, which is not registered under {}", allowed.join(", ")),
                            "schema.schema_url",
                            "pass the subject if the topic's subject has another name",
                        ))
                    }
                }
            }
        };
        if !allowed.contains(&subject.as_str()) {
            return Err(ref_err(
                format!("message {id} on topic {topic:?} references subject {:?}, not one of {}", clip(&subject), allowed.join(", ")),
                "schema.schema_url",
                "a message may only be decoded by its own topic's schema; pass the subject if the topic's subject has another name",
            ));
        }
        let v = self.prism_version(&subject, &version.to_string())?;
        let field = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        let (hash, text) = (field("hash"), field("schema"));
        let mut format = field("format").to_ascii_lowercase();
        if format.is_empty() {
            format = field("schemaType").to_ascii_lowercase();
        }
        if !claimed.is_empty() && claimed != hash {
            return Err(ref_err(
                format!(
                    "message {id} claims schema hash {:?}, but the registry's schema hashes to {hash}",
                    clip(&claimed)
                ),
                "schema.schema_hash",
                "the envelope's schema context was altered, or names another registry's schema",
            ));
        }
        let (descriptor, imports) = if format == "protobuf" {
            let (main, imports) = self.protobuf_descriptors(&subject, version)?;
            (Some(main), imports)
        } else {
            (None, Vec::new())
        };
        let references = if format == "avro" {
            let confluent = self.request_value(
                "GET",
                &format!("/subjects/{}/versions/{version}", crate::registry::segment(&subject)),
            )?;
            self.referenced_texts(&confluent)?
        } else {
            Vec::new()
        };
        Ok(ResolvedSchema {
            subject,
            version,
            format,
            hash,
            text,
            descriptor,
            imports,
            references,
        })
    }
}

/// A registry answer's protobuf schema in the serialized form (`?format=serialized`).
fn descriptor_of(doc: &Value, at: &str) -> Result<FileDescriptorProto> {
    let kind = doc.get("schemaType").and_then(Value::as_str).unwrap_or("PROTOBUF");
    if kind != "PROTOBUF" {
        return Err(crate::registry::refs_err(format!(
            "{at}: a {} schema where a protobuf file is imported",
            clip(kind)
        )));
    }
    let b64 = doc.get("schema").and_then(Value::as_str).unwrap_or("");
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).map_err(|e| {
        ref_err(
            format!("{at}: the registry's serialized schema is not base64: {e}"),
            "schema",
            "check the registry",
        )
    })?;
    FileDescriptorProto::decode(bytes.as_slice()).map_err(|e| {
        ref_err(
            format!("{at}: the registry's serialized schema is not a FileDescriptorProto: {e}"),
            "schema",
            "check the registry",
        )
    })
}

/// Files the registry compiles every protobuf schema with (app/schema/protoparse.py's
/// `LIBRARY_FILES`): importable without a reference.
fn is_library_import(name: &str) -> bool {
    name.starts_with("google/protobuf/") || name == "prism/annotations.proto"
}

/// An import path as protoc resolves it below its include roots: relative, `/`-separated,
/// no empty, `.` or `..` segment, no backslash or control character. Nothing is read from
/// disk here, but a name that could leave an include root is refused as the registry's
/// compiler would be misled by it.
fn check_import_name(name: &str, at: &str) -> Result<()> {
    let bad = name.is_empty()
        || name.len() > 512
        || name.starts_with('/')
        || name.contains('\\')
        || name.chars().any(char::is_control)
        || name.split('/').any(|seg| seg.is_empty() || seg == "." || seg == "..");
    if bad {
        return Err(crate::registry::refs_err(format!(
            "{at}: import path {:?} is not a relative path inside the schema's files",
            clip(name)
        )));
    }
    Ok(())
}

/// Every import of `file` names one of `doc`'s references (or a library file), and every
/// reference name is a safe import path.
fn check_imports(file: &FileDescriptorProto, doc: &Value, at: &str) -> Result<()> {
    let names: Vec<&str> = doc
        .get("references")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| r.get("name").and_then(Value::as_str))
        .collect();
    for n in &names {
        check_import_name(n, at)?;
    }
    for dep in &file.dependency {
        check_import_name(dep, at)?;
        if !is_library_import(dep) && !names.contains(&dep.as_str()) {
            return Err(crate::registry::refs_err(format!(
                "{at}: imports {:?}, which none of its references names (references: {})",
                clip(dep),
                clip(&names.join(", "))
            )));
        }
    }
    Ok(())
}

/// A payload decoded by its schema: the value (JSON) and the message type (protobuf).
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    pub value: Value,
    pub message_type: Option<String>,
}

impl ResolvedSchema {
    /// Decode `payload` (content type `content_type`) by this schema; `type_name` picks the
    /// protobuf message (the envelope's `schema_name`; empty: the file's first message).
    pub fn decode(&self, payload: &[u8], content_type: &str, type_name: &str) -> Result<Decoded> {
        let ct = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        let is_wire = matches!(
            ct.as_str(),
            "application/protobuf" | "application/x-protobuf" | "application/vnd.google.protobuf"
        );
        match (&self.descriptor, self.format.as_str()) {
            (Some(file), _) => {
                let pool = Pool {
                    main: file,
                    imports: &self.imports,
                };
                let msg = find_message(pool, type_name)?;
                let value = if is_wire {
                    decode_wire(pool, msg.1, payload, 0, &msg.0, Mode::Decode)?
                } else {
                    let v = json_payload(payload)?;
                    from_json(pool, (&msg.0, msg.1), &v, 0, &msg.0)?
                };
                Ok(Decoded {
                    value,
                    message_type: Some(msg.0),
                })
            }
            (None, "json") => {
                crate::registry::validate_json(&self.text, payload)?;
                Ok(Decoded {
                    value: json_payload(payload)?,
                    message_type: None,
                })
            }
            (None, "avro") => {
                let schema = crate::avro::AvroSchema::parse_with_references(&self.text, &self.references)?;
                let value = if ct.contains("json") {
                    schema.validate(payload, &ct)?;
                    json_payload(payload)?
                } else {
                    schema.decode_binary(payload)?
                };
                Ok(Decoded {
                    value,
                    message_type: None,
                })
            }
            (None, other) => Err(err!(
                Payload,
                format!("decoding a payload by a {other} schema is not supported by this client"),
                "schema.schema_format",
                "use a protobuf, Avro or JSON Schema, or read the payload with payload_bytes"
            )),
        }
    }
}

/// Validate a protobuf payload before publish: it must decode by `file` as the message
/// `type_url` names (`type.googleapis.com/pkg.Msg`; when it names none of the file's messages,
/// the file's first message, as the Python SDK falls back to the schema's root): the wire
/// format, or the protobuf JSON mapping when `content_type` says `json`. A payload that does
/// not decode is `Validation`, at the path of the failure (`pkg.Msg.field`).
pub fn validate_protobuf(file: &FileDescriptorProto, payload: &[u8], content_type: &str, type_url: &str) -> Result<()> {
    validate_protobuf_with_imports(file, &[], payload, content_type, type_url)
}

/// [`validate_protobuf`] for a schema whose message types may live in the files it imports
/// (`imports`: what [`RegistryClient::protobuf_descriptors`] fetches for its references).
pub fn validate_protobuf_with_imports(
    file: &FileDescriptorProto,
    imports: &[FileDescriptorProto],
    payload: &[u8],
    content_type: &str,
    type_url: &str,
) -> Result<()> {
    let file = Pool { main: file, imports };
    let wanted = type_url.rsplit('/').next().unwrap_or("");
    let msg = find_message(file, wanted).or_else(|_| find_message(file, ""))?;
    let decoded = if content_type.to_ascii_lowercase().contains("json") {
        crate::untrusted_json::parse(
            payload,
            "payload",
            crate::model::MAX_JSON_PAYLOAD_BYTES,
            64,
            crate::PrismError::Validation,
        )
        .and_then(|v: Value| from_json(file, (&msg.0, msg.1), &v, 0, &msg.0))
    } else {
        decode_wire(file, msg.1, payload, 0, &msg.0, Mode::Validate)
    };
    decoded.map(|_| ()).map_err(|e| match e {
        crate::PrismError::Payload(d) => err!(
            Validation,
            format!("payload is not a valid {} message: {}", msg.0, d.what),
            d.at,
            "fix the payload, or publish against another schema version"
        ),
        other => other,
    })
}

/// The registry's PII paths of a protobuf schema (`pii_fields`: schema paths by message
/// nesting, `OrderCreated.customer_email`, `LineItem.sku`, as app/schema/pii.py names them)
/// as payload paths of the message `type_name` (empty: the file's first) for
/// [`mask_pii`](crate::registry::mask_pii) on the decoded JSON or on a protobuf-JSON payload:
/// `customer_email`, `items[].sku`, `contacts.*.email` (a map's values), a field whose JSON name
/// differs from its proto name under both (`payer_email|payerEmail`), as the Python SDK masks
/// either spelling. A message type is not entered again below itself (recursive types).
pub fn payload_pii_paths(file: &FileDescriptorProto, type_name: &str, schema_paths: &[String]) -> Result<Vec<String>> {
    payload_pii_paths_with_imports(file, &[], type_name, schema_paths)
}

/// [`payload_pii_paths`] for a schema with imported files (its references): a field of an
/// imported message is named by that message (`Money.payer_email`), as the registry scans
/// the imported files too, and reached through the field that holds it (`total.payer_email`).
pub fn payload_pii_paths_with_imports(
    file: &FileDescriptorProto,
    imports: &[FileDescriptorProto],
    type_name: &str,
    schema_paths: &[String],
) -> Result<Vec<String>> {
    fn walk<'a>(
        file: Pool<'a>,
        msg: (String, &'a DescriptorProto, &'a str),
        at: &str,
        want: &[String],
        stack: &mut Vec<String>,
        out: &mut Vec<String>,
    ) {
        if stack.len() > MAX_DEPTH || stack.contains(&msg.0) {
            return;
        }
        let pkg = msg.2;
        let local = msg
            .0
            .strip_prefix(pkg)
            .map(|m| m.trim_start_matches('.'))
            .unwrap_or(&msg.0);
        stack.push(msg.0.clone());
        for f in &msg.1.field {
            // a JSON payload names a field by either spelling (`payer_email|payerEmail`)
            let json = f.json_name();
            let segment = if json.is_empty() || json == f.name() || json.contains(['.', '|', '*', '[']) {
                f.name().to_owned()
            } else {
                format!("{}|{json}", f.name())
            };
            let payload = format!("{at}{segment}");
            if want.contains(&format!("{local}.{}", f.name())) && !out.contains(&payload) {
                out.push(payload.clone());
                continue; // masked whole: nothing below it is left to mask
            }
            if let Some((_, entry)) = map_entry(file, f) {
                // a map: its values' fields, below every key (`contacts.*.email`)
                let value = entry.field.iter().find(|v| v.number() == 2);
                if let Some(sub) = value
                    .filter(|v| v.r#type() == Type::Message)
                    .and_then(|v| message_of(file, v).ok())
                {
                    walk(file, sub, &format!("{payload}.*."), want, stack, out);
                }
            } else if f.r#type() == Type::Message {
                if let Ok(sub) = message_of(file, f) {
                    let next = format!("{payload}{}.", if is_repeated(f) { "[]" } else { "" });
                    walk(file, sub, &next, want, stack, out);
                }
            }
        }
        stack.pop();
    }
    let file = Pool { main: file, imports };
    let root = find_message(file, type_name)?;
    let mut out = Vec::new();
    walk(file, root, "", schema_paths, &mut Vec::new(), &mut out);
    Ok(out)
}

/// A JSON payload, parsed within bounds (16 MiB, 64 levels): hostile input is a `Payload` error.
fn json_payload(payload: &[u8]) -> Result<Value> {
    crate::untrusted_json::parse(payload, "payload", 16 << 20, 64, crate::PrismError::Payload)
}

fn pay_err(what: String, at: &str) -> crate::PrismError {
    err!(
        Payload,
        what,
        at,
        "the payload does not match the schema its envelope references"
    )
}

/// A schema's file and the files it imports: messages are looked up by full name in all of
/// them (the schema's own first), then in the well-known types' files ([`well_known_files`]),
/// as a descriptor pool resolves a field's type.
#[derive(Clone, Copy)]
struct Pool<'a> {
    main: &'a FileDescriptorProto,
    imports: &'a [FileDescriptorProto],
}

impl<'a> Pool<'a> {
    fn files(self) -> impl Iterator<Item = &'a FileDescriptorProto> {
        std::iter::once(self.main)
            .chain(self.imports.iter())
            .chain(well_known_files().iter())
    }
}

/// The protobuf well-known types' files (`google/protobuf/timestamp.proto`, `struct.proto`,
/// `wrappers.proto`, `any.proto`, `duration.proto`, `empty.proto`, `field_mask.proto`, `type.proto`,
/// `api.proto`, `source_context.proto`), as Python's protobuf runtime carries them: a schema uses
/// them without a registry reference (the registry compiles every schema with them), so the
/// crate carries them. `src/wkt/well_known.pb` is generated by `src/wkt/generate.py` (its
/// `--check` is part of the test suite).
pub fn well_known_files() -> &'static [FileDescriptorProto] {
    static FILES: std::sync::OnceLock<Vec<FileDescriptorProto>> = std::sync::OnceLock::new();
    FILES.get_or_init(|| {
        // the checked-in set is decoded by a unit test: a broken file fails there, not here
        prost_types::FileDescriptorSet::decode(&include_bytes!("wkt/well_known.pb")[..])
            .map(|s| s.file)
            .unwrap_or_default()
    })
}

/// The message `name` (full, `pkg.Msg`, or nested `pkg.Outer.Inner`) of the schema's file or
/// of a file it imports (or a well-known type), with its full name and its file's package;
/// empty `name`: the schema's first message.
fn find_message<'a>(pool: Pool<'a>, name: &str) -> Result<(String, &'a DescriptorProto, &'a str)> {
    fn walk<'a>(prefix: &str, msgs: &'a [DescriptorProto], want: &str) -> Option<(String, &'a DescriptorProto)> {
        for m in msgs {
            let full = if prefix.is_empty() {
                m.name().to_owned()
            } else {
                format!("{prefix}.{}", m.name())
            };
            if full == want {
                return Some((full, m));
            }
            if want.starts_with(&format!("{full}.")) {
                if let Some(found) = walk(&full, &m.nested_type, want) {
                    return Some(found);
                }
            }
        }
        None
    }
    let want = name.trim_start_matches('.');
    if want.is_empty() {
        let file = pool.main;
        let pkg = file.package();
        let first = file
            .message_type
            .first()
            .ok_or_else(|| pay_err("the schema defines no message".into(), "schema"))?;
        let full = if pkg.is_empty() {
            first.name().to_owned()
        } else {
            format!("{pkg}.{}", first.name())
        };
        return Ok((full, first, pkg));
    }
    for file in pool.files() {
        let pkg = file.package();
        let inside = pkg.is_empty() || want.strip_prefix(pkg).is_some_and(|r| r.starts_with('.'));
        if inside {
            if let Some((full, m)) = walk(pkg, &file.message_type, want) {
                return Ok((full, m, pkg));
            }
        }
    }
    Err(pay_err(
        format!("the schema defines no message {:?}", clip(want)),
        "schema.schema_name",
    ))
}

/// The enum `name` (full, with or without the leading dot) of the pool, top-level or nested.
fn find_enum<'a>(pool: Pool<'a>, name: &str) -> Option<&'a prost_types::EnumDescriptorProto> {
    fn walk<'a>(
        prefix: &str,
        msgs: &'a [DescriptorProto],
        enums: &'a [prost_types::EnumDescriptorProto],
        want: &str,
    ) -> Option<&'a prost_types::EnumDescriptorProto> {
        let join = |n: &str| {
            if prefix.is_empty() {
                n.to_owned()
            } else {
                format!("{prefix}.{n}")
            }
        };
        if let Some(e) = enums.iter().find(|e| join(e.name()) == want) {
            return Some(e);
        }
        msgs.iter().find_map(|m| {
            let full = join(m.name());
            if want.starts_with(&format!("{full}.")) {
                walk(&full, &m.nested_type, &m.enum_type, want)
            } else {
                None
            }
        })
    }
    let want = name.trim_start_matches('.');
    pool.files()
        .find_map(|f| walk(f.package(), &f.message_type, &f.enum_type, want))
}

fn message_of<'a>(pool: Pool<'a>, f: &FieldDescriptorProto) -> Result<(String, &'a DescriptorProto, &'a str)> {
    find_message(pool, f.type_name())
}

/// The map entry message of a map field (`map<K, V> f`: a repeated message with the
/// `map_entry` option), if `f` is one.
fn map_entry<'a>(pool: Pool<'a>, f: &FieldDescriptorProto) -> Option<(String, &'a DescriptorProto)> {
    if f.r#type() != Type::Message || !is_repeated(f) {
        return None;
    }
    let (name, m, _) = message_of(pool, f).ok()?;
    m.options.as_ref().is_some_and(|o| o.map_entry()).then_some((name, m))
}

/// Messages nested deeper than this are refused: upb's and `json_format`'s limit (100), so a
/// payload Python reads is read here too (a Struct level is two messages, a map entry one).
const MAX_DEPTH: usize = 100;

fn is_repeated(f: &FieldDescriptorProto) -> bool {
    f.label() == Label::Repeated
}

/// How [`decode_wire`] treats the well-known types: `Decode` writes their JSON forms (and
/// refuses a value that has none, as `MessageToDict` does: a timestamp out of range ...);
/// `Validate` only reads them as messages, as the Python SDK's check (`FromString`) does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Decode,
    Validate,
}

/// The wire format of message `msg` (full name `path`) as `MessageToDict` writes it with
/// proto field names: repeated fields as arrays, maps as objects, 64-bit integers as strings,
/// enums by name, the last member of a oneof, the well-known types in their JSON forms (in
/// `Mode::Decode`). Unknown numbers are kept out - they are not the schema's.
fn decode_wire(
    file: Pool<'_>,
    msg: &DescriptorProto,
    buf: &[u8],
    depth: usize,
    path: &str,
    mode: Mode,
) -> Result<Value> {
    if depth > MAX_DEPTH {
        return Err(pay_err("the payload nests messages too deep".into(), path));
    }
    let mut out = Map::new();
    let proto3 = declared_proto3(file, msg);
    for r in wire::scan(buf, 0, buf.len()).map_err(|e| pay_err(format!("not protobuf: {e}"), path))? {
        let Some(f) = msg.field.iter().find(|f| f.number() == r.field as i32) else {
            continue;
        };
        let at = format!("{path}.{}", f.name());
        let raw = &buf[r.value_start..r.end];
        if let Some((entry_name, entry)) = map_entry(file, f) {
            let kv = decode_wire(file, entry, raw, depth + 1, &entry_name, mode)?;
            let key = map_key(entry, kv.get("key"));
            let value = match kv.get("value") {
                Some(v) => v.clone(),
                None => default_value(file, entry, depth, &entry_name, mode)?,
            };
            let e = out
                .entry(f.name().to_owned())
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(m) = e {
                m.insert(key, value);
            }
            continue;
        }
        let mut values = Vec::new();
        let packable = !matches!(f.r#type(), Type::String | Type::Bytes | Type::Message | Type::Group);
        if packable && r.wire_type == wire::LEN {
            let mut pos = 0;
            while pos < raw.len() {
                let (v, used) = scalar(f.r#type(), &raw[pos..], &at)?;
                values.push(enum_name(file, f, v));
                pos += used;
            }
        } else {
            let v = match f.r#type() {
                Type::String => Value::String(
                    String::from_utf8(raw.to_vec()).map_err(|_| pay_err("a string that is not UTF-8".into(), &at))?,
                ),
                Type::Bytes => Value::String(base64::engine::general_purpose::STANDARD.encode(raw)),
                Type::Message => {
                    let (name, sub, _) = message_of(file, f)?;
                    decode_wire(file, sub, raw, depth + 1, &name, mode)?
                }
                t => enum_name(file, f, scalar(t, raw, &at)?.0),
            };
            values.push(v);
        }
        if is_repeated(f) {
            let e = out
                .entry(f.name().to_owned())
                .or_insert_with(|| Value::Array(Vec::new()));
            if let Value::Array(a) = e {
                a.extend(values);
            }
        } else if let Some(v) = values.pop() {
            // a oneof holds its last member: the others written before it are cleared
            if let Some(i) = f.oneof_index {
                for other in msg
                    .field
                    .iter()
                    .filter(|o| o.oneof_index == Some(i) && o.name() != f.name())
                {
                    out.remove(other.name());
                }
            }
            if proto3 && implicit_presence(f) && is_default(file, f, &v) {
                // proto3 without `optional`: a default written on the wire is no value
                // (`MessageToDict` leaves the field out, as if it had not been written)
                out.remove(f.name());
            } else {
                out.insert(f.name().to_owned(), v);
            }
        }
    }
    if mode == Mode::Decode {
        if let Some(v) = wkt::to_json(file, path, &out, depth)? {
            return Ok(v);
        }
    }
    Ok(Value::Object(out))
}

/// A map entry's key as a JSON object key (`MessageToDict`: `str(key)`, bools `true`/`false`);
/// absent: the key type's default.
fn map_key(entry: &DescriptorProto, key: Option<&Value>) -> String {
    match key {
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
        None => match entry.field.iter().find(|f| f.number() == 1).map(|f| f.r#type()) {
            Some(Type::String) => String::new(),
            Some(Type::Bool) => "false".into(),
            _ => "0".into(),
        },
    }
}

/// The value of a map entry written without one: its type's default, as `MessageToDict` prints it.
fn default_value(file: Pool<'_>, entry: &DescriptorProto, depth: usize, entry_name: &str, mode: Mode) -> Result<Value> {
    let Some(f) = entry.field.iter().find(|f| f.number() == 2) else {
        return Ok(Value::Null);
    };
    Ok(match f.r#type() {
        Type::Message => {
            let (name, sub, _) = message_of(file, f)?;
            decode_wire(file, sub, &[], depth + 1, &name, mode)?
        }
        Type::String | Type::Bytes => Value::String(String::new()),
        Type::Bool => Value::Bool(false),
        Type::Double | Type::Float => serde_json::json!(0.0),
        Type::Int64 | Type::Uint64 | Type::Sint64 | Type::Fixed64 | Type::Sfixed64 => Value::String("0".into()),
        Type::Enum => enum_name(file, f, Value::from(0)),
        _ => {
            let _ = entry_name;
            Value::from(0)
        }
    })
}

/// An enum field's number as `MessageToDict` writes it: the value's name, or the number when
/// the enum has no such value (an open enum's unknown value).
/// Whether `msg` is declared in a proto3 file of the pool (found by identity, so nested and
/// same-named messages of other files are told apart).
fn declared_proto3(pool: Pool<'_>, msg: &DescriptorProto) -> bool {
    fn holds(msgs: &[DescriptorProto], want: &DescriptorProto) -> bool {
        msgs.iter()
            .any(|m| std::ptr::eq(m, want) || holds(&m.nested_type, want))
    }
    pool.files()
        .find(|f| holds(&f.message_type, msg))
        .is_some_and(|f| f.syntax() == "proto3")
}

/// A singular scalar field without explicit presence (proto3, not `optional`, no oneof): its
/// default value is indistinguishable from its absence.
fn implicit_presence(f: &FieldDescriptorProto) -> bool {
    !is_repeated(f)
        && !matches!(f.r#type(), Type::Message | Type::Group)
        && f.oneof_index.is_none()
        && !f.proto3_optional()
}

/// Whether the decoded value `v` of field `f` is its type's default: 0 (not -0.0), false, the
/// empty string or bytes, "0" for a 64-bit integer, the enum's value numbered 0.
fn is_default(pool: Pool<'_>, f: &FieldDescriptorProto, v: &Value) -> bool {
    match v {
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64().is_some_and(|x| x == 0.0 && x.is_sign_positive()),
        Value::String(s) if f.r#type() == Type::Enum => find_enum(pool, f.type_name())
            .and_then(|e| e.value.iter().find(|x| x.number() == 0))
            .is_some_and(|x| x.name() == s),
        Value::String(s) => {
            s.is_empty()
                || (s == "0"
                    && matches!(
                        f.r#type(),
                        Type::Int64 | Type::Uint64 | Type::Sint64 | Type::Fixed64 | Type::Sfixed64
                    ))
        }
        _ => false,
    }
}

fn enum_name(file: Pool<'_>, f: &FieldDescriptorProto, v: Value) -> Value {
    if f.r#type() != Type::Enum {
        return v;
    }
    let Some(n) = v.as_i64() else { return v };
    find_enum(file, f.type_name())
        .and_then(|e| e.value.iter().find(|x| i64::from(x.number()) == n))
        .map_or(v, |x| Value::String(x.name().to_owned()))
}

/// A float as `MessageToDict` writes it: NaN and the infinities as strings.
fn float_json(x: f64) -> Value {
    if x.is_nan() {
        Value::String("NaN".into())
    } else if x.is_infinite() {
        Value::String(if x > 0.0 { "Infinity" } else { "-Infinity" }.into())
    } else {
        x.into()
    }
}

/// One scalar of type `t` at the start of `b`: its JSON value (as `MessageToDict` writes it:
/// 64-bit integers as strings, a float by its shortest form) and the bytes it took.
fn scalar(t: Type, b: &[u8], at: &str) -> Result<(Value, usize)> {
    let short = || pay_err("a value runs past the end".into(), at);
    let fixed = |n: usize| b.get(..n).ok_or_else(short);
    let s = |x: String| Value::String(x);
    Ok(match t {
        Type::Double => (
            float_json(f64::from_le_bytes(fixed(8)?.try_into().unwrap_or([0; 8]))),
            8,
        ),
        Type::Float => {
            let x = f32::from_le_bytes(fixed(4)?.try_into().unwrap_or([0; 4]));
            // the shortest decimal that reads back as this float32 (protobuf's ToShortestFloat)
            let v = if x.is_finite() {
                format!("{x}")
                    .parse::<f64>()
                    .map_or_else(|_| float_json(f64::from(x)), Value::from)
            } else {
                float_json(f64::from(x))
            };
            (v, 4)
        }
        Type::Fixed64 => (
            s(u64::from_le_bytes(fixed(8)?.try_into().unwrap_or([0; 8])).to_string()),
            8,
        ),
        Type::Sfixed64 => (
            s(i64::from_le_bytes(fixed(8)?.try_into().unwrap_or([0; 8])).to_string()),
            8,
        ),
        Type::Fixed32 => (u32::from_le_bytes(fixed(4)?.try_into().unwrap_or([0; 4])).into(), 4),
        Type::Sfixed32 => (i32::from_le_bytes(fixed(4)?.try_into().unwrap_or([0; 4])).into(), 4),
        _ => {
            let (v, used) = wire::read_varint(b, 0, b.len()).map_err(|_| short())?;
            let val: Value = match t {
                Type::Bool => (v != 0).into(),
                Type::Int32 | Type::Enum => (v as i32).into(),
                Type::Int64 => s((v as i64).to_string()),
                Type::Uint32 => (v as u32).into(),
                Type::Uint64 => s(v.to_string()),
                Type::Sint32 => (((v >> 1) as i32) ^ -((v & 1) as i32)).into(),
                Type::Sint64 => s((((v >> 1) as i64) ^ -((v & 1) as i64)).to_string()),
                _ => {
                    return Err(pay_err(
                        format!("a field of type {t:?} in a packed or varint record"),
                        at,
                    ))
                }
            };
            (val, used)
        }
    })
}

/// A JSON payload read by the protobuf JSON mapping into message `msg` (full name `name`):
/// every key a field (by name or JSON name), every value of the field's type, the well-known
/// types in their JSON forms; out with proto names (the well-known types in their canonical
/// forms, as `MessageToDict` writes what `Parse` read). `path`: where, for errors.
fn from_json(
    file: Pool<'_>,
    (name, msg): (&str, &DescriptorProto),
    v: &Value,
    depth: usize,
    path: &str,
) -> Result<Value> {
    if depth > MAX_DEPTH {
        return Err(pay_err("the payload nests messages too deep".into(), path));
    }
    if let Some(out) = wkt::from_json(file, name, v, depth, path)? {
        return Ok(out);
    }
    let obj = v
        .as_object()
        .ok_or_else(|| pay_err(format!("{path} is not a JSON object"), path))?;
    let mut out = Map::new();
    for (k, val) in obj {
        let f = msg
            .field
            .iter()
            .find(|f| f.name() == k || f.json_name() == k)
            .ok_or_else(|| pay_err(format!("{path} has no field {:?}", clip(k)), path))?;
        let at = format!("{path}.{}", f.name());
        if val.is_null() {
            // null clears a field, but a google.protobuf.Value holds it (its null_value)
            if f.r#type() == Type::Message && f.type_name().trim_start_matches('.') == "google.protobuf.Value" {
                out.insert(f.name().to_owned(), Value::Null);
            }
            continue;
        }
        let one = |ft: &FieldDescriptorProto, x: &Value, at: &str| -> Result<Value> {
            let ok = match ft.r#type() {
                Type::Message => {
                    let (sub_name, sub, _) = message_of(file, ft)?;
                    return from_json(file, (&sub_name, sub), x, depth + 1, at);
                }
                Type::String | Type::Bytes => x.is_string(),
                Type::Bool => x.is_boolean(),
                Type::Double => x.is_number() || matches!(x.as_str(), Some("NaN" | "Infinity" | "-Infinity")),
                // json_format refuses a float32 past its range
                Type::Float => {
                    x.as_f64().is_some_and(|v| v.abs() <= f64::from(f32::MAX))
                        || matches!(x.as_str(), Some("NaN" | "Infinity" | "-Infinity"))
                }
                Type::Enum => x.is_string() || x.is_i64(),
                t => json_int(x).is_some_and(|n| int_range(t).contains(&n)),
            };
            if ok {
                Ok(canonical_scalar(file, ft, x))
            } else {
                Err(pay_err(format!("{at} is not a {:?} value", ft.r#type()), at))
            }
        };
        let decoded = if let Some((_, entry)) = map_entry(file, f) {
            let items = val
                .as_object()
                .ok_or_else(|| pay_err(format!("{at} is a map, not a JSON object"), &at))?;
            let (Some(kf), Some(vf)) = (
                entry.field.iter().find(|x| x.number() == 1),
                entry.field.iter().find(|x| x.number() == 2),
            ) else {
                return Err(pay_err(format!("{at}: a map entry without key or value"), &at));
            };
            let mut m = Map::new();
            for (key, item) in items {
                let key_ok = match kf.r#type() {
                    Type::String => true,
                    Type::Bool => key == "true" || key == "false",
                    _ => key.parse::<i128>().is_ok(),
                };
                if !key_ok {
                    return Err(pay_err(format!("{at} has a key {:?} of another type", clip(key)), &at));
                }
                let item_at = format!("{at}.{}", clip(key));
                m.insert(key.clone(), one(vf, item, &item_at)?);
            }
            Value::Object(m)
        } else if is_repeated(f) {
            let items = val
                .as_array()
                .ok_or_else(|| pay_err(format!("{at} is not a list"), &at))?;
            Value::Array(items.iter().map(|x| one(f, x, &at)).collect::<Result<_>>()?)
        } else {
            one(f, val, &at)?
        };
        out.insert(f.name().to_owned(), decoded);
    }
    Ok(Value::Object(out))
}

/// An integer as `json_format` reads one (`_ConvertInteger`): a JSON integer, a float with no
/// fraction, or a string of one without spaces.
fn json_int(x: &Value) -> Option<i128> {
    match x {
        Value::Number(n) => n
            .as_i64()
            .map(i128::from)
            .or_else(|| n.as_u64().map(i128::from))
            .or_else(|| {
                n.as_f64()
                    .filter(|f| f.fract() == 0.0 && f.abs() < 1e38)
                    .map(|f| f as i128)
            }),
        Value::String(s) if !s.contains(' ') => s.parse().ok(),
        _ => None,
    }
}

/// The values an integer field of type `t` holds.
fn int_range(t: Type) -> std::ops::RangeInclusive<i128> {
    match t {
        Type::Int32 | Type::Sint32 | Type::Sfixed32 => i128::from(i32::MIN)..=i128::from(i32::MAX),
        Type::Uint32 | Type::Fixed32 => 0..=i128::from(u32::MAX),
        Type::Uint64 | Type::Fixed64 => 0..=i128::from(u64::MAX),
        _ => i128::from(i64::MIN)..=i128::from(i64::MAX),
    }
}

/// A scalar `from_json` accepted, as `MessageToDict` writes it back: 64-bit integers as
/// strings, 32-bit ones as numbers, an enum's number by its name.
fn canonical_scalar(file: Pool<'_>, f: &FieldDescriptorProto, x: &Value) -> Value {
    let int = || json_int(x);
    match f.r#type() {
        Type::Int64 | Type::Uint64 | Type::Sint64 | Type::Fixed64 | Type::Sfixed64 => {
            int().map_or_else(|| x.clone(), |n| Value::String(n.to_string()))
        }
        Type::Int32 | Type::Uint32 | Type::Sint32 | Type::Fixed32 | Type::Sfixed32 => int()
            .and_then(|n| i64::try_from(n).ok())
            .map_or_else(|| x.clone(), Value::from),
        Type::Enum if x.is_i64() => enum_name(file, f, x.clone()),
        _ => x.clone(),
    }
}

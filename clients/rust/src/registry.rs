//! Schema registry client (Confluent-compatible routes and Prism's own `/v1`), validation
//! before publish, and PII-aware masking (docs/schema-registry.md, docs/sdk.md).
//!
//! HTTP/1.1 over a plain TCP connection with std only: the crate stays free of an HTTP stack
//! and its TLS dependencies. For HTTPS, reach the registry through a TLS-terminating proxy or
//! sidecar (docs/sdk-rust.md, "Schema registry").

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use base64::Engine;
use serde_json::Value;

use crate::error::{err, PrismError, Result};

/// How the client authenticates (the registry's `read` role is enough for everything but `register`).
#[derive(Clone, Default)]
pub enum Auth {
    #[default]
    None,
    Basic {
        user: String,
        password: String,
    },
    Bearer(String),
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Auth::None => "Auth::None",
            Auth::Basic { .. } => "Auth::Basic(..)",
            Auth::Bearer(_) => "Auth::Bearer(..)",
        })
    }
}

/// One registered version (Confluent's shape).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaVersion {
    pub subject: String,
    pub version: i64,
    pub id: i64,
    pub schema: String,
    /// `AVRO` when the registry leaves the field out (Confluent's convention).
    pub schema_type: String,
}

fn reg_err(what: String, hint: &str) -> PrismError {
    err!(Registry, what, "schema registry", hint)
}

/// A schema registry at `http://host:port[/prefix]`.
#[derive(Debug, Clone)]
pub struct RegistryClient {
    base: String,
    host: String,
    port: u16,
    prefix: String,
    auth: Auth,
    timeout: Duration,
}

/// Percent-encode one path segment (subjects may contain `/`, e.g. `common/money.proto`).
pub(crate) fn segment(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl RegistryClient {
    pub fn new(url: &str, auth: Auth) -> Result<Self> {
        let rest = url.strip_prefix("http://").ok_or_else(|| {
            err!(
                Config,
                format!("registry url {url:?} is not http://"),
                "registry_url",
                "use http://host:port (for HTTPS, a TLS-terminating proxy in front of the client)"
            )
        })?;
        let (hostport, prefix) = rest
            .split_once('/')
            .map(|(h, p)| (h, format!("/{}", p.trim_end_matches('/'))))
            .unwrap_or((rest, String::new()));
        let (host, port) = match hostport.rsplit_once(':') {
            Some((h, p)) => (
                h.to_owned(),
                p.parse()
                    .map_err(|_| err!(Config, format!("bad port in {url:?}"), "registry_url", ""))?,
            ),
            None => (hostport.to_owned(), 80),
        };
        let prefix = if prefix == "/" { String::new() } else { prefix };
        let base = url.trim_end_matches('/').to_owned();
        Ok(RegistryClient {
            base,
            host,
            port,
            prefix,
            auth,
            timeout: Duration::from_secs(10),
        })
    }

    fn request(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value> {
        let addr = format!("{}:{}", self.host, self.port);
        let unreachable = |e: std::io::Error| {
            reg_err(
                format!("cannot reach the registry at {addr}: {e}"),
                "check registry_url and that the registry runs",
            )
        };
        let mut s = TcpStream::connect(&addr).map_err(unreachable)?;
        s.set_read_timeout(Some(self.timeout)).map_err(unreachable)?;
        s.set_write_timeout(Some(self.timeout)).map_err(unreachable)?;
        let payload = body.map(|b| b.to_string()).unwrap_or_default();
        let mut req = format!("{method} {}{path} HTTP/1.1\r\nHost: {}\r\nAccept: application/vnd.schemaregistry.v1+json, application/json\r\nConnection: close\r\n", self.prefix, self.host);
        match &self.auth {
            Auth::None => {}
            Auth::Basic { user, password } => {
                let t = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
                req.push_str(&format!("Authorization: Basic {t}\r\n"));
            }
            Auth::Bearer(t) => req.push_str(&format!("Authorization: Bearer {t}\r\n")),
        }
        if body.is_some() {
            req.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                payload.len()
            ));
        }
        req.push_str("\r\n");
        req.push_str(&payload);
        s.write_all(req.as_bytes()).map_err(unreachable)?;
        let mut raw = Vec::new();
        s.take(64 * 1024 * 1024).read_to_end(&mut raw).map_err(unreachable)?;
        let bad = || {
            reg_err(
                "the registry's answer is not HTTP".into(),
                "check registry_url points at a registry",
            )
        };
        let split = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(bad)?;
        let head = std::str::from_utf8(&raw[..split]).map_err(|_| bad())?;
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(bad)?;
        let mut content = raw[split + 4..].to_vec();
        if head.lines().any(|l| {
            l.to_ascii_lowercase().starts_with("transfer-encoding:") && l.to_ascii_lowercase().contains("chunked")
        }) {
            content = dechunk(&content).ok_or_else(bad)?;
        }
        let json: Value = if content.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&content).map_err(|_| bad())?
        };
        if !(200..300).contains(&status) {
            let msg = json.get("message").and_then(Value::as_str).unwrap_or("").to_owned();
            let code = json.get("error_code").map(Value::to_string).unwrap_or_default();
            return Err(reg_err(
                format!("{method} {path}: HTTP {status} (error_code {code}) {msg}"),
                match status {
                    401 => "send credentials (Auth::Basic or Auth::Bearer)",
                    403 => "the credentials lack the role",
                    404 => "the subject or version does not exist",
                    _ => "see the registry's message",
                },
            ));
        }
        Ok(json)
    }

    fn version_of(v: &Value) -> Result<SchemaVersion> {
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        let n = |k: &str| v.get(k).and_then(Value::as_i64);
        Ok(SchemaVersion {
            subject: s("subject").unwrap_or_default(),
            version: n("version").unwrap_or(0),
            id: n("id").ok_or_else(|| {
                reg_err(
                    "a version without an id".into(),
                    "the registry is not Confluent-compatible",
                )
            })?,
            schema: s("schema").unwrap_or_default(),
            schema_type: s("schemaType").unwrap_or_else(|| "AVRO".into()),
        })
    }

    // ----------------------------------------------------------------- Confluent routes

    /// One GET of the registry's JSON (for the schema decoding module).
    pub(crate) fn request_value(&self, method: &str, path: &str) -> Result<Value> {
        self.request(method, path, None)
    }

    /// `GET /subjects`
    pub fn subjects(&self) -> Result<Vec<String>> {
        let v = self.request("GET", "/subjects", None)?;
        Ok(v.as_array()
            .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect())
            .unwrap_or_default())
    }
    /// `GET /subjects/{s}/versions/{v}` (`v` a number or `latest`)
    pub fn version(&self, subject: &str, version: &str) -> Result<SchemaVersion> {
        Self::version_of(&self.request(
            "GET",
            &format!("/subjects/{}/versions/{}", segment(subject), segment(version)),
            None,
        )?)
    }
    /// `GET /subjects/{s}/versions/latest`
    pub fn latest(&self, subject: &str) -> Result<SchemaVersion> {
        self.version(subject, "latest")
    }
    /// `GET /schemas/ids/{id}`: the schema text.
    pub fn schema_by_id(&self, id: i64) -> Result<String> {
        let v = self.request("GET", &format!("/schemas/ids/{id}"), None)?;
        Ok(v.get("schema").and_then(Value::as_str).unwrap_or("").to_owned())
    }
    /// `POST /subjects/{s}/versions`: register (needs a write role); returns the schema id.
    pub fn register(&self, subject: &str, schema: &str, schema_type: &str) -> Result<i64> {
        let body = serde_json::json!({"schema": schema, "schemaType": schema_type});
        let v = self.request("POST", &format!("/subjects/{}/versions", segment(subject)), Some(&body))?;
        v.get("id")
            .and_then(Value::as_i64)
            .ok_or_else(|| reg_err("register answered without an id".into(), ""))
    }

    // ----------------------------------------------------------------- Prism /v1 routes

    /// `GET /v1/subjects/{s}/versions/{v}`: the version with Prism's metadata (namespace, label,
    /// hash, `metadata.pii_fields`).
    pub fn prism_version(&self, subject: &str, version: &str) -> Result<Value> {
        self.request(
            "GET",
            &format!("/v1/subjects/{}/versions/{}", segment(subject), segment(version)),
            None,
        )
    }
    /// The PII field paths the registry found (tagged or detected) in a version.
    pub fn pii_fields(&self, subject: &str, version: &str) -> Result<Vec<String>> {
        let v = self.prism_version(subject, version)?;
        let list = v.pointer("/metadata/pii_fields").or_else(|| v.get("pii_fields"));
        Ok(list
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect())
            .unwrap_or_default())
    }
    /// A version's Avro schema with the named types its Confluent `references` define
    /// (fetched transitively, dependencies first, at most 32 deep and 256 versions, the
    /// registry's and the Go client's bounds).
    pub fn avro_schema(&self, subject: &str, version: i64) -> Result<crate::avro::AvroSchema> {
        let v = self.request(
            "GET",
            &format!("/subjects/{}/versions/{version}", segment(subject)),
            None,
        )?;
        let texts = self.referenced_texts(&v)?;
        let text = v.get("schema").and_then(Value::as_str).unwrap_or("");
        crate::avro::AvroSchema::parse_with_references(text, &texts)
    }

    /// The texts of the schemas a version's `references` name, transitively, dependencies first.
    pub(crate) fn referenced_texts(&self, v: &Value) -> Result<Vec<String>> {
        Ok(self
            .referenced_versions(v, "")?
            .into_iter()
            .map(|r| r.doc.get("schema").and_then(Value::as_str).unwrap_or("").to_owned())
            .collect())
    }

    /// Every version a registry answer's `references` name, transitively, each once,
    /// dependencies first (each version after the ones it references), as
    /// app/schema/references.py's `resolve_fetched` walks them. `query` is appended to each
    /// fetch (`?format=serialized` for protobuf). A registry answer is input too, so the walk
    /// is bounded: at most [`MAX_REFERENCE_DEPTH`] deep, [`MAX_REFERENCES`] versions and
    /// [`MAX_REFERENCED_BYTES`] of schema text in all; a reference back to a version on the
    /// current path (the root's own subject and version included) is a cycle. Each failure is
    /// `PrismError::Registry` at `schema.references`, naming the reference at fault.
    pub(crate) fn referenced_versions(&self, root: &Value, query: &str) -> Result<Vec<ReferencedVersion>> {
        let mut walk = RefWalk {
            client: self,
            query,
            stack: Vec::new(),
            done: std::collections::HashSet::new(),
            out: Vec::new(),
            bytes: 0,
        };
        if let (Some(s), Some(v)) = (
            root.get("subject").and_then(Value::as_str),
            root.get("version").and_then(Value::as_i64),
        ) {
            walk.stack.push((s.to_owned(), v));
        }
        walk.visit(root, "schema", 0)?;
        Ok(walk.out)
    }

    /// `GET /v1/policies/{namespace}`: the namespace's policy (`require_schema`, PII policy, ...).
    pub fn policy(&self, namespace: &str) -> Result<Value> {
        self.request("GET", &format!("/v1/policies/{}", segment(namespace)), None)
    }
}

/// How deep Confluent references may nest (the registry's own limit).
pub const MAX_REFERENCE_DEPTH: usize = 32;
/// How many referenced versions one schema may pull in, transitively (the Go client's bound).
pub const MAX_REFERENCES: usize = 256;
/// How much referenced schema text one schema may pull in, in all (Python's schema limit).
pub const MAX_REFERENCED_BYTES: usize = crate::untrusted_json::DEFAULT_MAX_BYTES;

/// One version a schema references (directly or through another reference).
#[derive(Debug, Clone)]
pub(crate) struct ReferencedVersion {
    /// The reference's `name` (a protobuf import path, an Avro type name, a `$ref` target).
    pub name: String,
    pub subject: String,
    pub version: i64,
    /// The registry's answer for the version (`schema`, `version`, `references`, ...).
    pub doc: Value,
}

pub(crate) fn refs_err(what: String) -> PrismError {
    err!(
        Registry,
        what,
        "schema.references",
        "register every referenced subject version, and keep references acyclic, at most 32 deep and at most 256 versions per schema (docs/schema-registry.md, \"Schema references\")"
    )
}

struct RefWalk<'c> {
    client: &'c RegistryClient,
    query: &'c str,
    /// (subject, version) of the versions on the current path: a reference back is a cycle
    stack: Vec<(String, i64)>,
    done: std::collections::HashSet<(String, i64)>,
    out: Vec<ReferencedVersion>,
    bytes: usize,
}

impl RefWalk<'_> {
    fn visit(&mut self, doc: &Value, where_: &str, depth: usize) -> Result<()> {
        let refs = match doc.get("references") {
            None | Some(Value::Null) => return Ok(()),
            Some(Value::Array(a)) => a.clone(),
            Some(_) => return Err(refs_err(format!("{where_}: references is not a list"))),
        };
        if refs.is_empty() {
            return Ok(());
        }
        if depth >= MAX_REFERENCE_DEPTH {
            return Err(refs_err(format!(
                "{where_}: references nest more than {MAX_REFERENCE_DEPTH} deep"
            )));
        }
        let mut names = std::collections::HashSet::new();
        for (i, r) in refs.iter().enumerate() {
            let text = |k: &str| r.get(k).and_then(Value::as_str).filter(|s| !s.is_empty());
            let (Some(name), Some(subject)) = (text("name"), text("subject")) else {
                return Err(refs_err(format!("{where_}: reference #{i} has no name or subject")));
            };
            let name: String = name.chars().take(300).collect();
            if !names.insert(name.clone()) {
                return Err(refs_err(format!("{where_}: reference name {name:?} appears twice")));
            }
            let version = match r.get("version") {
                None | Some(Value::Null) => "latest".to_owned(),
                Some(Value::Number(n)) if n.as_i64() == Some(-1) => "latest".to_owned(),
                Some(Value::Number(n)) if n.as_i64().is_some_and(|v| v >= 1) => n.to_string(),
                Some(Value::String(s)) if s == "latest" || s == "-1" => "latest".to_owned(),
                Some(Value::String(s))
                    if !s.is_empty() && s.len() < 10 && s.bytes().all(|b| b.is_ascii_digit()) && s != "0" =>
                {
                    s.clone()
                }
                Some(other) => {
                    return Err(refs_err(format!(
                        "{where_}: reference {name:?} has an invalid version {}",
                        other.to_string().chars().take(100).collect::<String>()
                    )))
                }
            };
            let at = format!("reference {name:?} (subject {subject:?} version {version})");
            let fetched = self
                .client
                .request(
                    "GET",
                    &format!(
                        "/subjects/{}/versions/{}{}",
                        segment(subject),
                        segment(&version),
                        self.query
                    ),
                    None,
                )
                .map_err(|e| refs_err(format!("{where_}: {at} cannot be read: {e}")))?;
            let number = fetched.get("version").and_then(Value::as_i64).unwrap_or(0);
            let key = (subject.to_owned(), number);
            if self.stack.contains(&key) {
                let chain: Vec<String> = self
                    .stack
                    .iter()
                    .chain(std::iter::once(&key))
                    .map(|(s, v)| format!("{s} v{v}"))
                    .collect();
                let chain: String = chain.join(" -> ").chars().take(500).collect();
                return Err(refs_err(format!("{where_}: references form a cycle ({chain})")));
            }
            if self.done.contains(&key) {
                continue; // reached again by another path (a diamond): already walked
            }
            if self.done.len() >= MAX_REFERENCES {
                return Err(refs_err(format!(
                    "{where_}: the schema pulls in more than {MAX_REFERENCES} referenced versions"
                )));
            }
            let text_len = fetched.get("schema").and_then(Value::as_str).map_or(0, str::len);
            self.bytes += text_len;
            if self.bytes > MAX_REFERENCED_BYTES {
                return Err(refs_err(format!(
                    "{where_}: the referenced schemas exceed {MAX_REFERENCED_BYTES} bytes in all"
                )));
            }
            self.stack.push(key.clone());
            let inner = format!("reference {name:?} ({subject} v{number})");
            self.visit(&fetched, &inner, depth + 1)?;
            self.stack.pop();
            self.done.insert(key);
            self.out.push(ReferencedVersion {
                name,
                subject: subject.to_owned(),
                version: number,
                doc: fetched,
            });
        }
        Ok(())
    }
}

/// Validate the envelope's payload against `version` of `subject` (a number or `latest`)
/// before publishing, and record in the envelope the schema it was validated against (the
/// schema context: url, version, format, hash, name) and `contains_pii` when the schema has PII
/// fields, as the Python SDK's `publish(..., schema_validation=True)` does. Nothing is sent here:
/// publish the envelope afterwards.
///
/// By the version's type: JSON Schema ([`validate_json`]); Avro ([`crate::avro`]: binary Avro,
/// or a JSON document when the content type says `json`); protobuf (the payload must decode by
/// the registry's descriptor as the message its `type_url` names, or the file's first message:
/// the wire format, or the protobuf JSON mapping when the content type says `json`). Every
/// failure of the payload is `PrismError::Validation` with the path of the failure.
pub fn validate_for_publish(
    env: &mut crate::Envelope,
    client: &RegistryClient,
    subject: &str,
    version: &str,
) -> Result<()> {
    let v = client.version(subject, version)?;
    let payload = env.payload_bytes()?;
    let format = match v.schema_type.as_str() {
        "JSON" => {
            validate_json(&v.schema, &payload)?;
            "json"
        }
        "AVRO" => {
            client
                .avro_schema(subject, v.version)?
                .validate(&payload, env.content_type())?;
            "avro"
        }
        "PROTOBUF" => {
            let (file, imports) = client.protobuf_descriptors(subject, v.version)?;
            let type_url = env.payload.as_ref().map(|p| p.type_url.as_str()).unwrap_or("");
            crate::schema_decode::validate_protobuf_with_imports(
                &file,
                &imports,
                &payload,
                env.content_type(),
                type_url,
            )?;
            "protobuf"
        }
        other => {
            return Err(err!(
                Config,
                format!("subject {subject:?} version {} has schema type {other:?}", v.version),
                "schema",
                "the registry serves JSON, AVRO or PROTOBUF schemas; check the subject"
            ))
        }
    };
    drop(payload);
    let prism = client
        .prism_version(subject, &v.version.to_string())
        .unwrap_or(Value::Null);
    let pii = prism
        .pointer("/metadata/pii_fields")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    env.header.schema = Some(crate::gen::v1::SchemaContext {
        schema_url: format!(
            "{}/v1/subjects/{}/versions/{}",
            client.base,
            segment(subject),
            v.version
        ),
        schema_version: v.version.to_string(),
        schema_format: format.into(),
        schema_hash: prism.get("hash").and_then(Value::as_str).unwrap_or("").to_owned(),
        schema_name: subject.to_owned(),
        ..Default::default()
    });
    if pii {
        env.security_mut().contains_pii = Some(true);
    }
    Ok(())
}

fn dechunk(mut b: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = b.windows(2).position(|w| w == b"\r\n")?;
        let size =
            usize::from_str_radix(std::str::from_utf8(&b[..line_end]).ok()?.split(';').next()?.trim(), 16).ok()?;
        b = &b[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(b.get(..size)?);
        b = b.get(size + 2..)?;
    }
}

// --------------------------------------------------------------------- validation

/// One reason a payload does not match its schema: the JSON path and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub path: String,
    pub message: String,
}

/// At most this many violations are reported (Python's `MAX_VIOLATIONS` keeps reports short).
pub const MAX_VIOLATIONS: usize = 20;

/// Compile a JSON Schema as Python's `jsonschema.validators.validator_for` does: the draft its
/// `$schema` names (2020-12 when absent), `format` checked. The `jsonschema` crate is built
/// without its HTTP and file resolvers, so a `$ref` outside the schema is refused here rather
/// than fetched.
fn compile(schema: &Value) -> Result<jsonschema::Validator> {
    jsonschema::options()
        .should_validate_formats(true)
        .build(schema)
        .map_err(|e| {
            err!(
                Config,
                format!("the JSON Schema does not compile: {e}"),
                format!("schema{}", e.schema_path()),
                "register a valid JSON Schema (references must resolve inside the schema)"
            )
        })
}

/// Python's `isidentifier()` for a path segment, so paths read `$.a.b` or `$["a b"]` alike.
fn is_identifier(k: &str) -> bool {
    let mut chars = k.chars();
    chars.next().is_some_and(|c| c == '_' || c.is_alphabetic()) && chars.all(|c| c == '_' || c.is_alphanumeric())
}

/// `$.items[2].price` for the JSON pointer `/items/2/price`, walking `instance` so an object
/// key that looks like a number stays a key (Python's `json_path`).
fn json_path(instance: &Value, pointer: &str) -> String {
    let mut out = String::from("$");
    let mut at = Some(instance);
    for raw in pointer.split('/').skip(1) {
        let seg = raw.replace("~1", "/").replace("~0", "~");
        match at {
            Some(Value::Array(a)) => {
                out.push_str(&format!("[{seg}]"));
                at = seg.parse::<usize>().ok().and_then(|i| a.get(i));
            }
            other => {
                if is_identifier(&seg) {
                    out.push('.');
                    out.push_str(&seg);
                } else {
                    out.push_str(&format!("[{}]", Value::String(seg.clone())));
                }
                at = other.and_then(|o| o.get(&seg));
            }
        }
    }
    out
}

fn violations_of(validator: &jsonschema::Validator, payload: &Value) -> Vec<Violation> {
    let mut errors: Vec<(Vec<String>, Violation)> = validator
        .iter_errors(payload)
        .map(|e| {
            let pointer = e.instance_path().as_str().to_owned();
            let key = pointer.split('/').skip(1).map(str::to_owned).collect();
            let v = Violation {
                path: json_path(payload, &pointer),
                message: e.to_string(),
            };
            (key, v)
        })
        .collect();
    // Python sorts by the path's parts as strings: the root first, then by key.
    errors.sort_by(|a, b| a.0.cmp(&b.0));
    errors.into_iter().take(MAX_VIOLATIONS).map(|(_, v)| v).collect()
}

/// Validate a JSON payload against a JSON Schema (every draft the `jsonschema` crate knows,
/// formats checked, as Python's `jsonschema` does). `Err(PrismError::Validation)` names the
/// first violation (by path) and counts the rest; a schema that does not compile is `Config`.
/// Both texts are read within Python's limits (`crate::untrusted_json`).
pub fn validate_json(schema_text: &str, payload: &[u8]) -> Result<()> {
    let schema: Value = crate::untrusted_json::parse(
        schema_text.as_bytes(),
        "schema",
        crate::untrusted_json::DEFAULT_MAX_BYTES,
        crate::untrusted_json::DEFAULT_MAX_DEPTH,
        PrismError::Config,
    )?;
    let validator = compile(&schema)?;
    let value: Value = crate::untrusted_json::parse(
        payload,
        "payload",
        crate::model::MAX_JSON_PAYLOAD_BYTES,
        crate::untrusted_json::DEFAULT_MAX_DEPTH,
        PrismError::Validation,
    )?;
    let out = violations_of(&validator, &value);
    match out.first() {
        None => Ok(()),
        Some(first) => Err(err!(
            Validation,
            format!(
                "payload does not match its schema: {} ({} violation(s))",
                first.message,
                out.len()
            ),
            first.path.clone(),
            "fix the payload or publish against the right schema version"
        )),
    }
}

/// All violations, by path (empty when valid; at most [`MAX_VIOLATIONS`]); a schema that
/// does not compile is an error.
pub fn violations(schema: &Value, payload: &Value) -> Result<Vec<Violation>> {
    Ok(violations_of(&compile(schema)?, payload))
}

// --------------------------------------------------------------------- PII masking

/// The mask written over PII values.
pub const MASK: &str = "***";

/// Replace the values at `pii_paths` (`customer.email`, `items[].ssn`: the registry's notation;
/// `attrs.*.x`: `*` is every key of a map, as the Python SDK's `pii_paths` writes it) with
/// [`MASK`]; returns how many values were masked. Paths that are not there are skipped. A
/// segment `*` matches every key, so an object key that is literally `*` is not told apart
/// (no Avro or protobuf field can be named so). A segment `a|b` matches key `a`, key `b` (a
/// protobuf field by its proto and its JSON name) and the key `a|b` itself.
pub fn mask_pii(value: &mut Value, pii_paths: &[String]) -> usize {
    pii_paths
        .iter()
        .map(|p| mask_path(value, &p.split('.').collect::<Vec<_>>()))
        .sum()
}

fn mask_path(v: &mut Value, parts: &[&str]) -> usize {
    let Some((first, rest)) = parts.split_first() else {
        return 0;
    };
    let (name, each) = match first.strip_suffix("[]") {
        Some(n) => (n, true),
        None => (*first, false),
    };
    let Some(obj) = v.as_object_mut() else {
        return 0;
    };
    if name == "*" {
        obj.values_mut().map(|child| mask_at(child, each, rest)).sum()
    } else if name.contains('|') {
        // either spelling of one field (`payer_email|payerEmail`), and the segment as a key
        let mut names: Vec<&str> = vec![name];
        names.extend(name.split('|').filter(|n| !n.is_empty()));
        names.dedup();
        obj.iter_mut()
            .filter(|(k, _)| names.contains(&k.as_str()))
            .map(|(_, child)| mask_at(child, each, rest))
            .sum()
    } else {
        obj.get_mut(name).map_or(0, |child| mask_at(child, each, rest))
    }
}

/// Mask `child` (each of its items when `each`), or the rest of the path below it.
fn mask_at(child: &mut Value, each: bool, rest: &[&str]) -> usize {
    let one = |x: &mut Value| {
        if rest.is_empty() {
            *x = Value::String(MASK.into());
            1
        } else {
            mask_path(x, rest)
        }
    };
    if each {
        child.as_array_mut().map_or(0, |items| items.iter_mut().map(one).sum())
    } else {
        one(child)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn validates_with_the_jsonschema_crate() {
        let schema = json!({"type": "object", "required": ["id"], "additionalProperties": false,
            "properties": {"id": {"type": "string"}, "n": {"type": "integer", "minimum": 0},
                           "items": {"type": "array", "items": {"type": "object", "properties": {"price": {"type": "number"}}}}}});
        let ok = json!({"id": "a", "n": 3, "items": [{"price": 1.5}]});
        assert!(violations(&schema, &ok).unwrap().is_empty());
        let bad = json!({"n": -1, "items": [{"price": "free"}], "x": 1});
        let v = violations(&schema, &bad).unwrap();
        let paths: Vec<_> = v.iter().map(|x| x.path.as_str()).collect();
        // additionalProperties reports at the object, as Python's jsonschema does
        assert_eq!(paths, ["$", "$", "$.items[0].price", "$.n"]);
        assert!(validate_json(&schema.to_string(), br#"{"id": 1}"#).is_err());
        // what the hand-written subset refused is now checked: $ref, oneOf, pattern, formats
        let rich = json!({"$defs": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]+$"}},
            "type": "object", "properties": {"sku": {"$ref": "#/$defs/sku"}, "email": {"format": "email"},
            "pay": {"oneOf": [{"type": "integer"}, {"type": "string"}]}, "odd key": {"type": "null"}}});
        assert!(
            violations(&rich, &json!({"sku": "ABC-1", "email": "a@b.example", "pay": 3}))
                .unwrap()
                .is_empty()
        );
        let v = violations(&rich, &json!({"sku": "abc", "email": "nope", "pay": 1.5, "odd key": 1})).unwrap();
        let paths: Vec<_> = v.iter().map(|x| x.path.as_str()).collect();
        assert_eq!(paths, ["$.email", r#"$["odd key"]"#, "$.pay", "$.sku"]);
        assert!(matches!(
            validate_json(&json!({"$ref": "http://elsewhere/x.json"}).to_string(), b"{}"),
            Err(PrismError::Config(_))
        ));
        assert!(matches!(validate_json("{", b"{}"), Err(PrismError::Config(_))));
        let deep = format!("{}1{}", "[".repeat(65), "]".repeat(65));
        assert!(matches!(
            validate_json("{}", deep.as_bytes()),
            Err(PrismError::Validation(_))
        ));
        assert!(validate_json(&schema.to_string(), b"not json").is_err());
    }

    #[test]
    fn masks_nested_and_repeated_paths() {
        let mut v = json!({"customer": {"email": "a@b", "name": "x"}, "items": [{"ssn": "1"}, {"ssn": "2"}], "id": 7});
        let n = mask_pii(
            &mut v,
            &["customer.email".into(), "items[].ssn".into(), "missing.path".into()],
        );
        assert_eq!(n, 3);
        assert_eq!(
            v,
            json!({"customer": {"email": "***", "name": "x"}, "items": [{"ssn": "***"}, {"ssn": "***"}], "id": 7})
        );
    }

    #[test]
    fn masks_every_value_of_a_map() {
        let mut v = json!({"attrs": {"a": {"x": "1", "y": 2}, "b": {"y": 3}, "c": 4},
                           "lists": {"k": [{"x": "1"}, {"x": "2"}]}, "whole": {"a": "1", "b": "2"}});
        let n = mask_pii(
            &mut v,
            &[
                "attrs.*.x".into(),
                "lists.*[].x".into(),
                "whole.*".into(),
                "nope.*.x".into(),
            ],
        );
        assert_eq!(n, 5);
        assert_eq!(
            v,
            json!({"attrs": {"a": {"x": "***", "y": 2}, "b": {"y": 3}, "c": 4},
                   "lists": {"k": [{"x": "***"}, {"x": "***"}]}, "whole": {"a": "***", "b": "***"}})
        );
    }

    #[test]
    fn urls_and_chunks() {
        let c = RegistryClient::new("http://reg:8081/base/", Auth::None).unwrap();
        assert_eq!((c.host.as_str(), c.port, c.prefix.as_str()), ("reg", 8081, "/base"));
        assert!(RegistryClient::new("https://reg", Auth::None).is_err());
        assert_eq!(dechunk(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n").unwrap(), b"abcde");
        assert_eq!(segment("common/money.proto"), "common%2Fmoney.proto");
    }
}

//! Confluent schema references in the registry client: a protobuf schema whose message uses a
//! type of an imported file (another subject) validates, decodes and names its PII through
//! that file; every hostile reference graph (a cycle, a missing subject, a chain too deep, too
//! many versions or bytes, an import no reference names, a path that climbs out) is a
//! `PrismError::Registry` at `schema.references`, never a panic. The registry here is a small
//! in-process HTTP server answering from a table; tests/clients/test_rust_client.py runs the
//! same against Prism's real registry.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;

use base64::Engine;
use prism_client::registry::{self, Auth, RegistryClient};
use prism_client::schema_decode::{payload_pii_paths_with_imports, validate_protobuf_with_imports};
use prism_client::{Envelope, PrismError};
use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FieldDescriptorProto, FileDescriptorProto};
use serde_json::{json, Value};

/// Serve `routes` (path without the query -> JSON answer; anything else 404) on a free port.
/// The thread ends with the test binary.
fn serve(routes: HashMap<String, Value>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let routes = Arc::new(routes);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match conn.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let head = String::from_utf8_lossy(&buf).into_owned();
            let target = head.split_whitespace().nth(1).unwrap_or("");
            let path = target.split('?').next().unwrap_or("");
            let (status, body) = match routes.get(path) {
                Some(v) => ("200 OK", v.to_string()),
                None => (
                    "404 Not Found",
                    json!({"error_code": 40401, "message": "Subject not found."}).to_string(),
                ),
            };
            let _ = conn.write_all(
                format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            );
        }
    });
    url
}

fn field(name: &str, number: i32, t: Type, type_name: &str) -> FieldDescriptorProto {
    FieldDescriptorProto {
        name: Some(name.into()),
        json_name: Some(name.into()),
        number: Some(number),
        r#type: Some(t as i32),
        label: Some(Label::Optional as i32),
        type_name: (!type_name.is_empty()).then(|| type_name.into()),
        ..Default::default()
    }
}

fn file(package: &str, deps: &[&str], messages: Vec<DescriptorProto>) -> FileDescriptorProto {
    FileDescriptorProto {
        name: Some("schema.proto".into()),
        package: Some(package.into()),
        dependency: deps.iter().map(|d| d.to_string()).collect(),
        message_type: messages,
        syntax: Some("proto3".into()),
        ..Default::default()
    }
}

fn message(name: &str, fields: Vec<FieldDescriptorProto>) -> DescriptorProto {
    DescriptorProto {
        name: Some(name.into()),
        field: fields,
        ..Default::default()
    }
}

/// A version as the registry answers `?format=serialized` for it.
fn version(subject: &str, n: i64, f: &FileDescriptorProto, refs: Value) -> (String, Value) {
    (
        format!("/subjects/{subject}/versions/{n}"),
        json!({"subject": subject, "version": n, "id": n, "schemaType": "PROTOBUF",
               "schema": base64::engine::general_purpose::STANDARD.encode(f.encode_to_vec()),
               "references": refs}),
    )
}

fn reference(name: &str, subject: &str, n: i64) -> Value {
    json!({"name": name, "subject": subject, "version": n})
}

/// shop.Order (subject `orders`) uses common.Money (`money`, imported as common/money.proto),
/// which uses common.Currency (`currency`, imported by money as common/currency.proto).
fn shop() -> (HashMap<String, Value>, FileDescriptorProto) {
    let currency = file(
        "common",
        &[],
        vec![message("Currency", vec![field("code", 1, Type::String, "")])],
    );
    let money = file(
        "common",
        &["common/currency.proto"],
        vec![message(
            "Money",
            vec![
                field("units", 1, Type::Int64, ""),
                field("currency", 2, Type::Message, ".common.Currency"),
                field("payer_email", 3, Type::String, ""),
            ],
        )],
    );
    let order = file(
        "shop",
        &["common/money.proto", "prism/annotations.proto"],
        vec![message(
            "Order",
            vec![
                field("id", 1, Type::String, ""),
                field("total", 2, Type::Message, ".common.Money"),
                field("email", 3, Type::String, ""),
            ],
        )],
    );
    let mut routes: HashMap<String, Value> = [
        version("currency", 1, &currency, json!([])),
        version(
            "money",
            1,
            &money,
            json!([reference("common/currency.proto", "currency", 1)]),
        ),
        version(
            "orders",
            1,
            &order,
            json!([reference("common/money.proto", "money", 1)]),
        ),
    ]
    .into_iter()
    .collect();
    routes.insert(
        "/subjects/orders/versions/latest".into(),
        routes["/subjects/orders/versions/1"].clone(),
    );
    (routes, order)
}

fn money_wire() -> Vec<u8> {
    // Order{id: "o-1", total: Money{units: 5, currency: Currency{code: "EUR"}, payer_email: "p@x"}, email: "a@b"}
    let currency = [&[0x0a, 3][..], b"EUR"].concat();
    let money = [
        &[0x08, 5, 0x12, currency.len() as u8][..],
        &currency,
        &[0x1a, 3],
        b"p@x",
    ]
    .concat();
    [
        &[0x0a, 3][..],
        b"o-1",
        &[0x12, money.len() as u8],
        &money,
        &[0x1a, 3],
        b"a@b",
    ]
    .concat()
}

fn registry_refusal(e: PrismError, words: &str) {
    match e {
        PrismError::Registry(d) => {
            assert_eq!(d.at, "schema.references", "{d:?}");
            assert!(d.what.contains(words), "{:?} lacks {words:?}", d.what);
        }
        other => panic!("not a registry error: {other:?}"),
    }
}

#[test]
fn imported_message_types_validate_decode_and_name_their_pii() {
    let (routes, _) = shop();
    let client = RegistryClient::new(&serve(routes), Auth::None).unwrap();
    let (main, imports) = client.protobuf_descriptors("orders", 1).unwrap();
    let names: Vec<&str> = imports.iter().map(|f| f.name()).collect();
    assert_eq!(names, ["common/currency.proto", "common/money.proto"]); // dependencies first
    let url = "type.googleapis.com/shop.Order";
    validate_protobuf_with_imports(&main, &imports, &money_wire(), "application/protobuf", url).unwrap();
    let doc = br#"{"id": "o", "total": {"units": "7", "currency": {"code": "EUR"}}}"#;
    validate_protobuf_with_imports(&main, &imports, doc, "application/json", url).unwrap();
    // a failure inside the imported type is reported at the imported field
    let bad = br#"{"total": {"currency": {"code": 5}}}"#;
    match validate_protobuf_with_imports(&main, &imports, bad, "application/json", url) {
        Err(PrismError::Validation(d)) => assert_eq!(d.at, "shop.Order.total.currency.code"),
        other => panic!("{other:?}"),
    }
    // without the imports, the type is unknown: what the client did before references
    assert!(validate_protobuf_with_imports(&main, &[], doc, "application/json", url).is_err());

    // the registry's PII paths name the imported message's field by its message
    let pii = ["Order.email".to_string(), "Money.payer_email".to_string()];
    let paths = payload_pii_paths_with_imports(&main, &imports, "shop.Order", &pii).unwrap();
    assert_eq!(paths, ["total.payer_email", "email"]);

    // before publish, through the registry
    let mut env = Envelope::builder("orders", "shop")
        .bytes(money_wire())
        .content_type("application/protobuf")
        .build()
        .unwrap();
    registry::validate_for_publish(&mut env, &client, "orders", "latest").unwrap();
    assert_eq!(env.header.schema.as_ref().unwrap().schema_format, "protobuf");
    let mut env = Envelope::builder("orders", "shop")
        .bytes(bad.to_vec())
        .content_type("application/json")
        .build()
        .unwrap();
    assert!(matches!(
        registry::validate_for_publish(&mut env, &client, "orders", "latest"),
        Err(PrismError::Validation(_))
    ));
}

#[test]
fn decoding_by_the_envelope_schema_reads_imported_types_and_masks_them() {
    let (mut routes, _) = shop();
    routes.insert(
        "/v1/subjects/orders/versions/1".into(),
        json!({"subject": "orders", "version": 1, "format": "PROTOBUF", "hash": "sha256:h",
               "schema": "syntax = \"proto3\";", "metadata": {"pii_fields": ["Order.email", "Money.payer_email"]}}),
    );
    let client = RegistryClient::new(&serve(routes), Auth::None).unwrap();
    let mut env = Envelope::builder("orders", "shop")
        .bytes(money_wire())
        .content_type("application/protobuf")
        .build()
        .unwrap();
    env.header.schema = Some(prism_client::gen::v1::SchemaContext {
        schema_url: "http://reg/subjects/orders/versions/1".into(),
        schema_hash: "sha256:h".into(),
        ..Default::default()
    });
    let schema = client.resolve_for_envelope(&env, &[]).unwrap();
    assert_eq!(schema.imports.len(), 2);
    let mut decoded = schema
        .decode(&money_wire(), "application/protobuf", "shop.Order")
        .unwrap()
        .value;
    assert_eq!(
        decoded,
        // int64 as a string, as MessageToDict writes it
        json!({"id": "o-1", "total": {"units": "5", "currency": {"code": "EUR"}, "payer_email": "p@x"}, "email": "a@b"})
    );
    let pii = client.pii_fields("orders", "1").unwrap();
    let paths =
        payload_pii_paths_with_imports(schema.descriptor.as_ref().unwrap(), &schema.imports, "shop.Order", &pii)
            .unwrap();
    assert_eq!(registry::mask_pii(&mut decoded, &paths), 2);
    assert_eq!(decoded["total"]["payer_email"], "***");
    assert_eq!(decoded["email"], "***");
}

#[test]
fn a_reference_cycle_is_refused() {
    let a = file(
        "a",
        &["b.proto"],
        vec![message("A", vec![field("b", 1, Type::Message, ".b.B")])],
    );
    let b = file(
        "b",
        &["a.proto"],
        vec![message("B", vec![field("a", 1, Type::Message, ".a.A")])],
    );
    let routes = [
        version("a", 1, &a, json!([reference("b.proto", "b", 1)])),
        version("b", 1, &b, json!([reference("a.proto", "a", 1)])),
    ]
    .into_iter()
    .collect();
    let client = RegistryClient::new(&serve(routes), Auth::None).unwrap();
    registry_refusal(
        client.protobuf_descriptors("a", 1).unwrap_err(),
        "cycle (a v1 -> b v1 -> a v1)",
    );
}

#[test]
fn a_missing_referenced_subject_is_refused() {
    let (mut routes, _) = shop();
    routes.remove("/subjects/currency/versions/1");
    let client = RegistryClient::new(&serve(routes), Auth::None).unwrap();
    registry_refusal(
        client.protobuf_descriptors("orders", 1).unwrap_err(),
        "reference \"common/currency.proto\" (subject \"currency\" version 1) cannot be read",
    );
}

#[test]
fn a_chain_too_deep_is_refused() {
    let mut routes = HashMap::new();
    for i in 0..40 {
        let f = file(
            &format!("p{i}"),
            &[&format!("f{}.proto", i + 1)],
            vec![message("M", vec![])],
        );
        let refs = json!([reference(&format!("f{}.proto", i + 1), &format!("s{}", i + 1), 1)]);
        let (k, v) = version(&format!("s{i}"), 1, &f, refs);
        routes.insert(k, v);
    }
    let client = RegistryClient::new(&serve(routes), Auth::None).unwrap();
    registry_refusal(
        client.protobuf_descriptors("s0", 1).unwrap_err(),
        "nest more than 32 deep",
    );
}

#[test]
fn too_many_versions_or_bytes_are_refused() {
    let leaf = file("l", &[], vec![message("L", vec![])]);
    let mut routes = HashMap::new();
    let mut refs = Vec::new();
    for i in 0..300 {
        let (k, v) = version(&format!("l{i}"), 1, &leaf, json!([]));
        routes.insert(k, v);
        refs.push(reference(&format!("l{i}.proto"), &format!("l{i}"), 1));
    }
    let deps: Vec<String> = (0..300).map(|i| format!("l{i}.proto")).collect();
    let deps: Vec<&str> = deps.iter().map(String::as_str).collect();
    let (k, v) = version(
        "wide",
        1,
        &file("w", &deps, vec![message("W", vec![])]),
        Value::Array(refs),
    );
    routes.insert(k, v);
    // two referenced versions of 9 MiB each: 18 MiB of referenced text, over the 16 MiB budget
    let big = "A".repeat(9 << 20);
    for s in ["big1", "big2"] {
        routes.insert(
            format!("/subjects/{s}/versions/1"),
            json!({"subject": s, "version": 1, "schemaType": "PROTOBUF", "schema": big}),
        );
    }
    let (k, v) = version(
        "heavy",
        1,
        &file("h", &["b1.proto", "b2.proto"], vec![message("H", vec![])]),
        json!([reference("b1.proto", "big1", 1), reference("b2.proto", "big2", 1)]),
    );
    routes.insert(k, v);
    let client = RegistryClient::new(&serve(routes), Auth::None).unwrap();
    registry_refusal(client.protobuf_descriptors("wide", 1).unwrap_err(), "more than 256");
    registry_refusal(client.protobuf_descriptors("heavy", 1).unwrap_err(), "bytes in all");
}

#[test]
fn an_import_no_reference_names_is_refused() {
    let (mut routes, order) = shop();
    // the file imports common/money.proto, the reference is named otherwise
    let (k, v) = version("orders", 1, &order, json!([reference("common/cash.proto", "money", 1)]));
    routes.insert(k, v);
    let client = RegistryClient::new(&serve(routes), Auth::None).unwrap();
    registry_refusal(
        client.protobuf_descriptors("orders", 1).unwrap_err(),
        "imports \"common/money.proto\", which none of its references names",
    );
}

#[test]
fn an_import_path_that_climbs_out_is_refused() {
    for name in [
        "../secrets/key.proto",
        "/etc/passwd",
        "common/../../x.proto",
        "a//b.proto",
        "a\\b.proto",
        "./a.proto",
    ] {
        let f = file("t", &[name], vec![message("T", vec![])]);
        let leaf = file("l", &[], vec![message("L", vec![])]);
        let routes = [
            version("t", 1, &f, json!([reference(name, "leaf", 1)])),
            version("leaf", 1, &leaf, json!([])),
        ]
        .into_iter()
        .collect();
        let client = RegistryClient::new(&serve(routes), Auth::None).unwrap();
        registry_refusal(
            client.protobuf_descriptors("t", 1).unwrap_err(),
            "is not a relative path inside the schema's files",
        );
    }
}

#[test]
fn an_avro_reference_cycle_is_refused_too() {
    let routes = [
        (
            "/subjects/x/versions/1".to_string(),
            json!({"subject": "x", "version": 1, "id": 1,
                   "schema": r#"{"type": "record", "name": "X", "fields": [{"name": "y", "type": ["null", "Y"]}]}"#,
                   "references": [reference("Y", "y", 1)]}),
        ),
        (
            "/subjects/y/versions/1".to_string(),
            json!({"subject": "y", "version": 1, "id": 2,
                   "schema": r#"{"type": "record", "name": "Y", "fields": [{"name": "x", "type": ["null", "X"]}]}"#,
                   "references": [reference("X", "x", 1)]}),
        ),
    ]
    .into_iter()
    .collect();
    let client = RegistryClient::new(&serve(routes), Auth::None).unwrap();
    registry_refusal(client.avro_schema("x", 1).unwrap_err(), "cycle");
}

mod hostile_graphs {
    use super::*;
    use proptest::prelude::*;

    const NAMES: [&str; 6] = [
        "a.proto",
        "b/c.proto",
        "../x.proto",
        "",
        "d.proto",
        "prism/annotations.proto",
    ];

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        /// Any reference graph the registry may answer (cycles, self-references, unknown
        /// subjects, bad names and versions, imports with and without references) gives the
        /// files or a `Registry` error - never a panic; files given are named by safe references.
        #[test]
        fn any_reference_graph_is_files_or_a_registry_error(
            edges in proptest::collection::vec(
                (0usize..5, 0usize..6, 0usize..6, prop_oneof![Just(json!(1)), Just(json!(2)), Just(json!("latest")), Just(json!(-1)), Just(json!(0)), Just(json!("x"))]),
                0..12),
            deps in proptest::collection::vec((0usize..5, 0usize..6), 0..8),
        ) {
            let mut refs: Vec<Vec<Value>> = vec![Vec::new(); 5];
            for (from, name, to, v) in &edges {
                refs[*from].push(json!({"name": NAMES[*name], "subject": format!("s{to}"), "version": v}));
            }
            let mut imports: Vec<Vec<&str>> = vec![Vec::new(); 5];
            for (from, name) in &deps {
                imports[*from].push(NAMES[*name]);
            }
            let mut routes = HashMap::new();
            for i in 0..5 {
                let f = file(&format!("p{i}"), &imports[i], vec![message("M", vec![])]);
                let (k, v) = version(&format!("s{i}"), 1, &f, Value::Array(refs[i].clone()));
                routes.insert(format!("/subjects/s{i}/versions/latest"), v.clone());
                routes.insert(k, v);
            }
            let client = RegistryClient::new(&serve(routes), Auth::None).unwrap();
            match client.protobuf_descriptors("s0", 1) {
                Ok((_, files)) => {
                    for f in files {
                        prop_assert!(!f.name().is_empty() && !f.name().contains(".."), "{:?}", f.name());
                    }
                }
                Err(PrismError::Registry(_)) => {}
                Err(other) => prop_assert!(false, "not a registry error: {other:?}"),
            }
        }
    }
}

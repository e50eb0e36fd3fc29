//! Decoding a payload by the schema its envelope references (`prism_client::schema_decode`):
//! the reference read from the schema context, a protobuf message decoded from its wire format
//! and read from the protobuf JSON mapping, and hostile payloads - a value or a `PrismError`,
//! never a panic. tests/clients/test_chain.py runs it against a real registry and worker.

use prism_client::gen::v1::SchemaContext;
use prism_client::schema_decode::{payload_pii_paths, schema_ref, validate_protobuf, ResolvedSchema, SchemaRef};
use prism_client::{Envelope, PrismError};
use proptest::prelude::*;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FieldDescriptorProto, FileDescriptorProto};
use serde_json::json;

fn field(name: &str, json_name: &str, number: i32, t: Type, label: Label, type_name: &str) -> FieldDescriptorProto {
    FieldDescriptorProto {
        name: Some(name.into()),
        json_name: Some(json_name.into()),
        number: Some(number),
        r#type: Some(t as i32),
        label: Some(label as i32),
        type_name: (!type_name.is_empty()).then(|| type_name.into()),
        ..Default::default()
    }
}

/// OrderCreated and LineItem of topologies/schemas/order_created.proto, as a descriptor.
fn orders() -> ResolvedSchema {
    use Label::{Optional as O, Repeated as R};
    let order = DescriptorProto {
        name: Some("OrderCreated".into()),
        field: vec![
            field("order_id", "orderId", 1, Type::String, O, ""),
            field("customer_id", "customerId", 2, Type::String, O, ""),
            field("items", "items", 4, Type::Message, R, ".prism.examples.orders.LineItem"),
            field("total", "total", 5, Type::Double, O, ""),
            field("flags", "flags", 9, Type::Sint32, R, ""),
        ],
        ..Default::default()
    };
    let item = DescriptorProto {
        name: Some("LineItem".into()),
        field: vec![
            field("sku", "sku", 1, Type::String, O, ""),
            field("qty", "qty", 2, Type::Int32, O, ""),
        ],
        ..Default::default()
    };
    ResolvedSchema {
        subject: "orders".into(),
        version: 1,
        format: "protobuf".into(),
        hash: "sha256:x".into(),
        text: String::new(),
        descriptor: Some(FileDescriptorProto {
            name: Some("order_created.proto".into()),
            package: Some("prism.examples.orders".into()),
            message_type: vec![order, item],
            ..Default::default()
        }),
        imports: Vec::new(),
        references: Vec::new(),
    }
}

const ORDER: &str = "prism.examples.orders.OrderCreated";

fn env_with(url: &str, ext: Option<&str>) -> Envelope {
    let mut b = Envelope::builder("orders", "order-events").text("{}");
    if let Some(id) = ext {
        b = b.extension("schema.id", id.as_bytes().to_vec());
    }
    let mut env = b.build().unwrap();
    env.header.schema = Some(SchemaContext {
        schema_url: url.into(),
        schema_hash: "sha256:abc".into(),
        ..Default::default()
    });
    env
}

#[test]
fn the_reference_is_read_as_go_reads_it() {
    let h = "sha256:abc".to_string();
    assert_eq!(
        schema_ref(&env_with("http://reg:8081/v1/subjects/orders%2Dx/versions/3", None)).unwrap(),
        SchemaRef::SubjectVersion {
            subject: "orders-x".into(),
            version: 3,
            hash: h.clone()
        }
    );
    assert_eq!(
        schema_ref(&env_with("http://reg/schemas/ids/12", None)).unwrap(),
        SchemaRef::Id {
            id: 12,
            hash: h.clone()
        }
    );
    assert_eq!(
        schema_ref(&env_with("", Some(" 7 "))).unwrap(),
        SchemaRef::Id { id: 7, hash: h }
    );
    for bad in [
        "",
        "http://reg/subjects/x/versions/latest",
        "http://reg/schemas/ids/0",
        "/subjects/%zz/versions/1",
    ] {
        assert!(
            matches!(schema_ref(&env_with(bad, None)), Err(PrismError::Registry(_))),
            "{bad}"
        );
    }
}

#[test]
fn a_json_payload_is_read_by_the_protobuf_json_mapping() {
    let s = orders();
    let d = s
        .decode(
            br#"{"orderId":"o-1","customer_id":"c","items":[{"sku":"A","qty":2}],"total":1.5}"#,
            "application/json",
            ORDER,
        )
        .unwrap();
    assert_eq!(d.message_type.as_deref(), Some(ORDER));
    assert_eq!(
        d.value,
        json!({"order_id": "o-1", "customer_id": "c", "items": [{"sku": "A", "qty": 2}], "total": 1.5})
    );
    for bad in [
        &br#"{"nope":1}"#[..],
        br#"{"total":"x"}"#,
        br#"{"items":{"sku":"A"}}"#,
        br#"{"items":[{"qty":"2x"}]}"#,
        b"[1]",
        b"{",
    ] {
        assert!(matches!(
            s.decode(bad, "application/json", ORDER),
            Err(PrismError::Payload(_))
        ));
    }
    assert!(matches!(
        s.decode(b"{}", "application/json", "prism.Other"),
        Err(PrismError::Payload(_))
    ));
}

#[test]
fn a_wire_payload_is_decoded_field_by_field() {
    let s = orders();
    // order_id "o-1", items [{sku "A", qty 2}], total 1.5, flags packed [-1, 1], unknown field 15
    let mut b = vec![0x0a, 3, b'o', b'-', b'1', 0x22, 5, 0x0a, 1, b'A', 0x10, 2, 0x29];
    b.extend_from_slice(&1.5f64.to_le_bytes());
    b.extend_from_slice(&[0x4a, 2, 1, 2, 0x78, 1]);
    let d = s.decode(&b, "application/protobuf", ORDER).unwrap();
    assert_eq!(
        d.value,
        json!({"order_id": "o-1", "items": [{"sku": "A", "qty": 2}], "total": 1.5, "flags": [-1, 1]})
    );
    assert!(matches!(
        s.decode(&[0x0a, 9, 1], "application/x-protobuf", ORDER),
        Err(PrismError::Payload(_))
    ));
    assert!(matches!(
        s.decode(&[0x0a, 1, 0xff], "application/protobuf", ORDER),
        Err(PrismError::Payload(_))
    ));
}

#[test]
fn a_protobuf_payload_is_validated_before_publish_with_the_failures_path() {
    let s = orders();
    let file = s.descriptor.as_ref().unwrap();
    let url = format!("type.googleapis.com/{ORDER}");
    let mut ok = vec![0x0a, 3, b'o', b'-', b'1', 0x22, 5, 0x0a, 1, b'A', 0x10, 2];
    assert!(validate_protobuf(file, &ok, "application/protobuf", &url).is_ok());
    // a type URL the schema does not define: the file's first message, as Python falls back
    assert!(validate_protobuf(file, &ok, "application/protobuf", "type.googleapis.com/x.Y").is_ok());
    ok.extend_from_slice(&[0x0a, 9, 1]);
    let e = validate_protobuf(file, &ok, "application/protobuf", &url).unwrap_err();
    assert!(matches!(&e, PrismError::Validation(d) if d.at == ORDER), "{e:?}");
    // a LineItem whose sku is not UTF-8: the failure is at the nested field
    let bad_item = [0x22, 3, 0x0a, 1, 0xff];
    let e = validate_protobuf(file, &bad_item, "application/protobuf", &url).unwrap_err();
    assert!(
        matches!(&e, PrismError::Validation(d) if d.at == "prism.examples.orders.LineItem.sku"),
        "{e:?}"
    );
    assert!(validate_protobuf(
        file,
        br#"{"orderId":"o","items":[{"qty":2}]}"#,
        "application/json",
        &url
    )
    .is_ok());
    let e = validate_protobuf(file, br#"{"items":[{"qty":"two"}]}"#, "application/json", &url).unwrap_err();
    assert!(
        matches!(&e, PrismError::Validation(d) if d.at == "prism.examples.orders.OrderCreated.items.qty"),
        "{e:?}"
    );
    for bad in [&b"{"[..], b"[]", br#"{"nope": 1}"#] {
        assert!(matches!(
            validate_protobuf(file, bad, "application/json", &url),
            Err(PrismError::Validation(_))
        ));
    }
    let empty = FileDescriptorProto::default();
    assert!(validate_protobuf(&empty, b"", "application/protobuf", "").is_err());
}

#[test]
fn registry_pii_paths_become_payload_paths_of_the_decoded_message() {
    let s = orders();
    let file = s.descriptor.as_ref().unwrap();
    let want = ["OrderCreated.customer_id", "LineItem.sku", "Nope.x"].map(String::from);
    assert_eq!(
        payload_pii_paths(file, ORDER, &want).unwrap(),
        ["customer_id|customerId", "items[].sku"]
    );
    // a protobuf-JSON payload may name the field by its JSON name: masked too, as Python does
    let mut sent = json!({"customerId": "c", "order_id": "o", "items": [{"sku": "A"}]});
    assert_eq!(
        prism_client::registry::mask_pii(&mut sent, &payload_pii_paths(file, ORDER, &want).unwrap()),
        2
    );
    assert_eq!(
        sent,
        json!({"customerId": "***", "order_id": "o", "items": [{"sku": "***"}]})
    );
    let mut b = vec![0x12, 1, b'c', 0x22, 3, 0x0a, 1, b'A', 0x22, 3, 0x0a, 1, b'B'];
    b.extend_from_slice(&[0x0a, 1, b'o']);
    let mut v = s.decode(&b, "application/protobuf", ORDER).unwrap().value;
    let n = prism_client::registry::mask_pii(&mut v, &payload_pii_paths(file, ORDER, &want).unwrap());
    assert_eq!(n, 3);
    assert_eq!(
        v,
        json!({"order_id": "o", "customer_id": "***", "items": [{"sku": "***"}, {"sku": "***"}]})
    );
    assert!(payload_pii_paths(file, "x.Nope", &want).is_err());
}

proptest! {
    #[test]
    fn hostile_payloads_give_a_value_or_a_prism_error(data in proptest::collection::vec(any::<u8>(), 0..256)) {
        let s = orders();
        for ct in ["application/protobuf", "application/json"] {
            let _ = s.decode(&data, ct, ORDER);
            let _ = s.decode(&data, ct, "");
        }
    }

    #[test]
    fn validation_agrees_with_decoding(data in proptest::collection::vec(any::<u8>(), 0..256)) {
        let s = orders();
        let file = s.descriptor.as_ref().unwrap();
        for ct in ["application/protobuf", "application/json"] {
            let checked = validate_protobuf(file, &data, ct, ORDER);
            prop_assert!(matches!(checked, Ok(()) | Err(PrismError::Validation(_))));
            prop_assert_eq!(checked.is_ok(), s.decode(&data, ct, ORDER).is_ok());
        }
    }
}

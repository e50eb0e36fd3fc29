"""confluent-kafka's own serializers and deserializers (Avro, Protobuf, JSON Schema) with
``auto.register.schemas`` against a live registry (real uvicorn, SQLite and PostgreSQL), the
way a Confluent producer/consumer uses it: the serializer registers (Protobuf: base64 of a
``FileDescriptorProto``, its imports registered as references), the deserializer fetches the
writer schema by id (Protobuf: ``?format=serialized``) and decodes. One test also carries the
bytes through the embedded broker with a real produce/consume."""

from __future__ import annotations

import time
import uuid

import httpx
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pool, message_factory

from app.schema.protoparse import compile_proto
from tests.support import creds

MONEY = 'syntax = "proto3";\npackage common;\nmessage Money {\n  string currency = 1;\n  int64 units = 2;\n}\n'
ORDER = '''syntax = "proto3";
package shop.v1;
import "common/money.proto";
import "google/protobuf/timestamp.proto";
message Order {
  string order_id = 1;
  common.Money total = 2;
  map<string, int32> quantities = 3;
  repeated Line lines = 4;
  oneof payment { string card = 5; string iban = 6; }
  optional string note = 7;
  google.protobuf.Timestamp placed_at = 8;
  message Line { string sku = 1; }
  enum Status { STATUS_UNSPECIFIED = 0; STATUS_PAID = 1; }
  Status status = 9;
}
'''
AVRO = ('{"type":"record","name":"Reading","namespace":"sensors","fields":[{"name":"celsius","type":"double"},'
        '{"name":"unit","type":"string","default":"C"}]}')
JSON_SCHEMA = ('{"$schema":"http://json-schema.org/draft-07/schema#","title":"Click","type":"object",'
               '"properties":{"url":{"type":"string"},"n":{"type":"integer"}},"required":["url"]}')


def _order_class():  # type: ignore[no-untyped-def]
    """A generated-code equivalent built from protoc's output in a private pool (no _pb2 file)."""
    compiled = compile_proto(ORDER, "shop/v1/order.proto", imports={"common/money.proto": MONEY})
    pool = descriptor_pool.DescriptorPool()
    for f in compiled.files:  # dependencies come first in protoc's --include_imports output
        pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.v1.Order"))


def _ctx(topic: str) -> SerializationContext:
    return SerializationContext(topic, MessageField.VALUE)


def test_protobuf_serializer_auto_registers_and_deserializer_reads(live_server) -> None:  # type: ignore[no-untyped-def]
    order_cls = _order_class()
    client = SchemaRegistryClient(live_server.sr_conf())
    ser = ProtobufSerializer(order_cls, client, {"auto.register.schemas": True, "use.deprecated.format": False})
    msg = order_cls(order_id="o-1", card="4111", note="", status=1)
    msg.total.currency, msg.total.units = "EUR", 1250
    msg.quantities["sku-1"] = 3
    msg.lines.add(sku="sku-1")
    msg.placed_at.seconds = 1_700_000_000
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    data = ser(msg, _ctx(topic))
    assert data[0] == 0  # Confluent framing: magic byte, then the schema id

    # What the serializer registered is stored as .proto text, its import as a reference.
    fresh = SchemaRegistryClient(live_server.sr_conf())
    latest = fresh.get_latest_version(f"{topic}-value")
    assert "message Order" in latest.schema.schema_str and "import \"common/money.proto\";" in latest.schema.schema_str
    assert [(r.name, r.subject) for r in latest.schema.references] == [("common/money.proto", "common/money.proto")]
    assert fresh.get_latest_version("common/money.proto").schema.schema_str.startswith('syntax = "proto3";')

    de = ProtobufDeserializer(order_cls, {"use.deprecated.format": False}, fresh)
    back = de(data, _ctx(topic))
    assert back == msg and back.total.units == 1250 and back.HasField("note")

    # A second serializer (another producer process) finds the same id: idempotent, no new version.
    again = ProtobufSerializer(order_cls, SchemaRegistryClient(live_server.sr_conf()),
                               {"auto.register.schemas": True, "use.deprecated.format": False})
    assert again(msg, _ctx(topic))[:5] == data[:5]
    assert fresh.get_versions(f"{topic}-value") == [1]

    # The same schema registered as text is the same id (one canonical form either way).
    with httpx.Client(base_url=live_server.url, auth=creds("admin")) as h:
        sid = int.from_bytes(data[1:5], "big")
        text = h.get(f"/schemas/ids/{sid}").json()
        r = h.post(f"/subjects/{topic}-value", json={"schema": text["schema"], "schemaType": "PROTOBUF",
                                                     "references": text["references"]})
        assert r.status_code == 200 and r.json()["id"] == sid
        ser_body = h.get(f"/schemas/ids/{sid}?format=serialized").json()
        assert ser_body["schema"] != text["schema"] and ser_body["schemaType"] == "PROTOBUF"
        v = h.get(f"/subjects/{topic}-value/versions/1?format=serialized").json()
        assert v["schema"] == ser_body["schema"]


def test_protobuf_serialized_form_that_cannot_be_rendered_is_refused(live_server) -> None:  # type: ignore[no-untyped-def]
    import base64

    from google.protobuf import descriptor_pb2

    fdp = descriptor_pb2.FileDescriptorProto(name="g.proto", package="g", syntax="proto2")
    m = fdp.message_type.add(name="M")
    m.field.add(name="grp", number=1, label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
                type=descriptor_pb2.FieldDescriptorProto.TYPE_GROUP, type_name=".g.M.Grp")
    m.nested_type.add(name="Grp")
    body = {"schema": base64.b64encode(fdp.SerializeToString()).decode(), "schemaType": "PROTOBUF"}
    r = httpx.post(f"{live_server.url}/subjects/g-value/versions", json=body, auth=creds("admin"))
    assert r.status_code == 422 and r.json()["error_code"] == 42201
    assert "group" in r.json()["message"] and "g.proto" in r.json()["message"]


def test_avro_serializer_round_trip(live_server) -> None:  # type: ignore[no-untyped-def]
    client = SchemaRegistryClient(live_server.sr_conf())
    topic = f"sensors-{uuid.uuid4().hex[:8]}"
    data = AvroSerializer(client, AVRO, conf={"auto.register.schemas": True})({"celsius": 21.5, "unit": "C"},
                                                                                _ctx(topic))
    back = AvroDeserializer(SchemaRegistryClient(live_server.sr_conf()))(data, _ctx(topic))
    assert back == {"celsius": 21.5, "unit": "C"}
    assert client.get_latest_version(f"{topic}-value").schema.schema_type == "AVRO"


def test_json_schema_serializer_round_trip(live_server) -> None:  # type: ignore[no-untyped-def]
    client = SchemaRegistryClient(live_server.sr_conf())
    topic = f"clicks-{uuid.uuid4().hex[:8]}"
    data = JSONSerializer(JSON_SCHEMA, client, conf={"auto.register.schemas": True})({"url": "/a", "n": 2},
                                                                                     _ctx(topic))
    back = JSONDeserializer(None, schema_registry_client=SchemaRegistryClient(live_server.sr_conf()))(
        data, _ctx(topic))
    assert back == {"url": "/a", "n": 2}
    assert client.get_latest_version(f"{topic}-value").schema.schema_type == "JSON"


def test_protobuf_through_the_embedded_broker(live_server, broker) -> None:  # type: ignore[no-untyped-def]
    from confluent_kafka import Consumer, Producer

    order_cls = _order_class()
    client = SchemaRegistryClient(live_server.sr_conf())
    ser = ProtobufSerializer(order_cls, client, {"auto.register.schemas": True, "use.deprecated.format": False})
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    sent = [order_cls(order_id=f"o-{i}", iban=f"DE{i}") for i in range(3)]
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": False})
    for m in sent:
        producer.produce(topic, value=ser(m, _ctx(topic)))
    assert producer.flush(20) == 0

    de = ProtobufDeserializer(order_cls, {"use.deprecated.format": False}, SchemaRegistryClient(live_server.sr_conf()))
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got = []
    deadline = time.monotonic() + 30
    try:
        while len(got) < len(sent) and time.monotonic() < deadline:
            rec = consumer.poll(0.5)
            if rec is None or rec.error():
                continue
            got.append(de(rec.value(), _ctx(topic)))
    finally:
        consumer.close()
    # the auto-created topic may have several partitions: order is per partition only
    assert sorted(got, key=lambda m: m.order_id) == sent

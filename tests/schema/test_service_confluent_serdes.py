"""confluent-kafka's own serializers and deserializers (Avro, Protobuf, JSON Schema) with
``auto.register.schemas`` against a live registry (real uvicorn, SQLite and PostgreSQL), the
way a Confluent producer/consumer uses it: the serializer registers (Protobuf: base64 of a
``FileDescriptorProto``, its imports registered as references), the deserializer fetches the
writer schema by id (Protobuf: ``?format=serialized``) and decodes. One test also carries the
bytes through the embedded broker with a real produce/consume."""

from __future__ import annotations

import functools
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pool, message_factory

from app.schema.protoparse import compile_proto
from app.schema.store import PostgresStore
from tests.schema.conftest import _pg_available, free_port, pg_dsn
from tests.support import creds, require, write_users_file

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
    # auto.register.schemas=False: the serializer looks the serialized form up (POST /subjects/{s}).
    lookup_only = ProtobufSerializer(order_cls, SchemaRegistryClient(live_server.sr_conf()),
                                     {"auto.register.schemas": False, "use.deprecated.format": False})
    assert lookup_only(msg, _ctx(topic))[:5] == data[:5]

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
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

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
    # Every partition assigned from the start, no group join: the embedded broker holds a new
    # group's first join for ~half the session timeout (librdkafka's default 45 s, so ~22 s of
    # this test's ~24 s; docs/platform-notes.md, "Group joins are slow").
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
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



def _sr_conf(url: str) -> dict[str, str]:
    name, password = creds("admin")
    return {"url": url, "basic.auth.user.info": f"{name}:{password}"}


@pytest.fixture(params=["sqlite", "postgres"])
def serve_process(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """``prism schema serve`` as operators run it (its own process, uvloop/httptools), on a
    SQLite file or a fresh PostgreSQL schema; yields its URL. PostgreSQL: skipped locally
    when absent, a failure under CI=true (tests/schema/conftest.py)."""
    pg_schema = None
    if request.param == "sqlite":
        store_url = f"sqlite:///{tmp_path / 'reg.db'}"
    else:
        problem = _pg_available()
        require(not problem, f"PostgreSQL at {pg_dsn()}: {problem}")
        pg_schema = f"prism_reg_test_{uuid.uuid4().hex[:10]}"
        store_url = f"{pg_dsn()}?schema={pg_schema}"
    port = free_port()
    log = (tmp_path / "serve.log").open("wb")
    users = write_users_file(tmp_path / "users.yaml")
    proc = subprocess.Popen([sys.executable, "-m", "app.cli.main", "schema", "serve", "--port", str(port),
                             "--store", store_url, "--users-file", str(users)],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{url}/subjects", timeout=1)
                break
            except httpx.TransportError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("prism schema serve did not start: "
                                         + (tmp_path / "serve.log").read_text()) from None
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()
        if pg_schema:
            store = PostgresStore(pg_dsn(), pg_schema=pg_schema)
            store.drop()
            store.close()


def test_serializers_against_a_prism_schema_serve_process(serve_process: str) -> None:
    order_cls = _order_class()
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    msg = order_cls(order_id="o-9", iban="DE9", status=1)
    msg.quantities["a"] = 1
    data = ProtobufSerializer(order_cls, SchemaRegistryClient(_sr_conf(serve_process)),
                              {"auto.register.schemas": True, "use.deprecated.format": False})(msg, _ctx(topic))
    back = ProtobufDeserializer(order_cls, {"use.deprecated.format": False},
                                SchemaRegistryClient(_sr_conf(serve_process)))(data, _ctx(topic))
    assert back == msg
    reading = {"celsius": -3.0, "unit": "C"}
    avro = AvroSerializer(SchemaRegistryClient(_sr_conf(serve_process)), AVRO)(reading, _ctx(f"{topic}-a"))
    assert AvroDeserializer(SchemaRegistryClient(_sr_conf(serve_process)))(avro, _ctx(f"{topic}-a")) == reading
    click = {"url": "/b"}
    js = JSONSerializer(JSON_SCHEMA, SchemaRegistryClient(_sr_conf(serve_process)))(click, _ctx(f"{topic}-j"))
    assert JSONDeserializer(None, schema_registry_client=SchemaRegistryClient(_sr_conf(serve_process)))(
        js, _ctx(f"{topic}-j")) == click
    client = SchemaRegistryClient(_sr_conf(serve_process))
    client.update_global_mode("READONLY")
    with pytest.raises(SchemaRegistryError) as e:
        AvroSerializer(client, AVRO.replace('"C"', '"F"'))(reading, _ctx(f"{topic}-ro"))
    assert e.value.error_code == 42205


def test_serialized_protobuf_keeps_prism_pii_tags_under_an_enforcing_policy(live_server) -> None:  # type: ignore[no-untyped-def]
    from app.schema.protodesc import serialize

    head = 'syntax = "proto3";\npackage users;\nimport "prism/annotations.proto";\n'
    untagged = serialize(compile_proto(head + "message User {\n  string email = 1;\n}\n").main)
    tagged = serialize(compile_proto(head + 'message User {\n  string email = 1 [(prism.pii) = "email"];\n}\n').main)
    with httpx.Client(base_url=live_server.url, auth=creds("admin")) as h:
        assert h.put("/v1/policies/__global__", json={"pii_policy": "enforce"}).status_code == 200
        r = h.post("/subjects/users-value/versions", json={"schema": untagged, "schemaType": "PROTOBUF"})
        assert (r.status_code, r.json()["error_code"]) == (422, 42201) and "email" in r.json()["message"]
        r = h.post("/subjects/users-value/versions", json={"schema": tagged, "schemaType": "PROTOBUF"})
        assert r.status_code == 200
        stored = h.get(f"/schemas/ids/{r.json()['id']}").json()["schema"]
        assert '(prism.pii) = "email"' in stored


OPTS = '''syntax = "proto3";
package acme;
import "google/protobuf/descriptor.proto";
message Rule { int32 min_len = 1; repeated string tags = 2; }
enum Level { LEVEL_UNSPECIFIED = 0; LEVEL_HIGH = 1; }
extend google.protobuf.FieldOptions {
  string sensitivity = 51000;
  Rule rule = 51001;
  Level level = 51003;
}
extend google.protobuf.MessageOptions { int32 retention_days = 51002; }
'''
TICKET = '''syntax = "proto3";
package support;
import "acme/opts.proto";
message Ticket {
  option (acme.retention_days) = 30;
  string title = 1 [(acme.sensitivity) = "high", (acme.rule) = { min_len: 3 tags: "a" tags: "b" }];
  string body = 2 [(acme.level) = LEVEL_HIGH];
}
'''


def test_custom_options_defined_by_an_import_survive_the_serialized_form(live_server) -> None:  # type: ignore[no-untyped-def]
    compiled = compile_proto(TICKET, "support/ticket.proto", imports={"acme/opts.proto": OPTS})
    pool = descriptor_pool.DescriptorPool()
    for f in compiled.files:
        pool.Add(f)
    ticket_cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("support.Ticket"))
    topic = f"tickets-{uuid.uuid4().hex[:8]}"
    ser = ProtobufSerializer(ticket_cls, SchemaRegistryClient(live_server.sr_conf()),
                             {"auto.register.schemas": True, "use.deprecated.format": False})
    msg = ticket_cls(title="printer", body="on fire")
    data = ser(msg, _ctx(topic))
    de = ProtobufDeserializer(ticket_cls, {"use.deprecated.format": False},
                              SchemaRegistryClient(live_server.sr_conf()))
    assert de(data, _ctx(topic)) == msg
    stored = SchemaRegistryClient(live_server.sr_conf()).get_latest_version(f"{topic}-value").schema.schema_str
    assert "option (acme.retention_days) = 30;" in stored
    assert '(acme.sensitivity) = "high"' in stored and "(acme.level) = LEVEL_HIGH" in stored
    assert "(acme.rule) = { min_len: 3" in stored


# --------------------------------------------------------------------------- least privilege
# confluent-kafka 2.16's serializers AND deserializers first ask GET
# /associations/resources/-/{topic} (the associated subject name strategy). These tests run every
# format with the users a real deployment gives producers and consumers - `writer`
# (write:orders.) and `reader` (read) - never admin, so a route that silently needs admin fails.


@functools.cache
def _shared_order_class():  # type: ignore[no-untyped-def]
    """One Order class for a whole test: a serializer refuses instances of another build."""
    return _order_class()


def _writer_serializer(fmt: str, client: SchemaRegistryClient, *, auto_register: bool = True):  # type: ignore[no-untyped-def]
    if fmt == "avro":
        return AvroSerializer(client, AVRO, conf={"auto.register.schemas": auto_register})
    if fmt == "json":
        return JSONSerializer(JSON_SCHEMA, client, conf={"auto.register.schemas": auto_register})
    # The import is registered as a reference subject too; the writer may only write under
    # orders., so the team names its reference subjects there (a reference subject strategy).
    return ProtobufSerializer(_shared_order_class(), client, {
        "auto.register.schemas": auto_register, "use.deprecated.format": False,
        "reference.subject.name.strategy": lambda ctx, dep: f"orders.refs.{dep.name}"})


def _reader_deserializer(fmt: str, client: SchemaRegistryClient):  # type: ignore[no-untyped-def]
    if fmt == "avro":
        return AvroDeserializer(client)
    if fmt == "json":
        return JSONDeserializer(None, schema_registry_client=client)
    return ProtobufDeserializer(_shared_order_class(), {"use.deprecated.format": False}, client)


def _value(fmt: str):  # type: ignore[no-untyped-def]
    if fmt == "avro":
        return {"celsius": 21.5, "unit": "C"}
    if fmt == "json":
        return {"url": "/a", "n": 2}
    msg = _shared_order_class()(order_id="o-1", card="4111", status=1)
    msg.total.currency, msg.total.units = "EUR", 1250
    return msg


@pytest.mark.parametrize("fmt", ["avro", "json", "protobuf"])
def test_serdes_with_least_privilege_users(live_server, fmt: str) -> None:  # type: ignore[no-untyped-def]
    topic = f"orders.{fmt}-{uuid.uuid4().hex[:8]}"
    value = _value(fmt)
    # the producer: registers (auto.register.schemas) with write:orders. only
    data = _writer_serializer(fmt, SchemaRegistryClient(live_server.sr_conf("writer")))(value, _ctx(topic))
    assert data[0] == 0
    # another producer process that only looks the schema up (auto.register.schemas=False)
    again = _writer_serializer(fmt, SchemaRegistryClient(live_server.sr_conf("writer")), auto_register=False)
    assert again(value, _ctx(topic))[:5] == data[:5]
    # the consumer: read only
    back = _reader_deserializer(fmt, SchemaRegistryClient(live_server.sr_conf("reader")))(data, _ctx(topic))
    assert back == value
    # a reader serializing with lookups only works too (it never writes) ...
    lookup = _writer_serializer(fmt, SchemaRegistryClient(live_server.sr_conf("reader")), auto_register=False)
    assert lookup(value, _ctx(topic))[:5] == data[:5]
    # ... but a reader cannot register a new subject, nor a writer outside its prefix: 403, not a silent pass
    with pytest.raises(SchemaRegistryError) as e:
        _writer_serializer(fmt, SchemaRegistryClient(live_server.sr_conf("reader")))(value, _ctx(f"{topic}-new"))
    assert (e.value.http_status_code, e.value.error_code) == (403, 40301)
    with pytest.raises(SchemaRegistryError) as e:
        _writer_serializer(fmt, SchemaRegistryClient(live_server.sr_conf("writer")))(value, _ctx(f"pay.{fmt}-x"))
    assert (e.value.http_status_code, e.value.error_code) == (403, 40301)


@pytest.mark.parametrize("fmt", ["avro", "json", "protobuf"])
def test_serdes_follow_an_association_with_least_privilege_users(live_server, fmt: str) -> None:  # type: ignore[no-untyped-def]
    """The writer binds its topic to a subject that is not ``<topic>-value`` (POST
    /associations); serializer and deserializer then use that subject, as writer and reader."""
    from confluent_kafka.schema_registry import AssociationCreateOrUpdateInfo, AssociationCreateOrUpdateRequest

    topic = f"orders.assoc-{fmt}-{uuid.uuid4().hex[:8]}"
    subject = f"orders.contracts.{fmt}-{uuid.uuid4().hex[:6]}"
    value = _value(fmt)
    writer = SchemaRegistryClient(live_server.sr_conf("writer"))
    # the subject needs a live version before it can be associated (40907 otherwise)
    with pytest.raises(SchemaRegistryError) as e:
        writer.create_association(AssociationCreateOrUpdateRequest(
            resource_name=topic, resource_namespace="lkc-test", resource_id=f"id-{topic}", resource_type="topic",
            associations=[AssociationCreateOrUpdateInfo(subject=subject, association_type="value")]))
    assert (e.value.http_status_code, e.value.error_code) == (409, 40907)
    seed = _writer_serializer(fmt, writer)
    seed(value, _ctx(subject))  # registers under <subject>-value (the topic strategy)
    registered = f"{subject}-value"
    resp = writer.create_association(AssociationCreateOrUpdateRequest(
        resource_name=topic, resource_namespace="lkc-test", resource_id=f"id-{topic}", resource_type="topic",
        associations=[AssociationCreateOrUpdateInfo(subject=registered, association_type="value")]))
    assert resp.associations[0].subject == registered
    data = _writer_serializer(fmt, SchemaRegistryClient(live_server.sr_conf("writer")))(value, _ctx(topic))
    reader = SchemaRegistryClient(live_server.sr_conf("reader"))
    assert [a.subject for a in reader.get_associations_by_resource_name(topic, "-", "topic", ["value"])] == [registered]
    assert _reader_deserializer(fmt, reader)(data, _ctx(topic)) == value
    # the serializer used the associated subject: nothing was registered under <topic>-value
    assert f"{topic}-value" not in reader.get_subjects()
    assert int.from_bytes(data[1:5], "big") == reader.get_latest_version(registered).schema_id

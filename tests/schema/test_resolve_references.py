"""Schemas with Confluent references, read by the worker and the SDK (not only by the registry):
a protobuf schema importing two other subjects (one of which imports a third) through a real
registry - resolved, hashed as the registry hashes it, validated by the worker's validator
and by `publish(schema_validation=True)`, decoded and masked by the SDK's resolver - and the
same for Avro named types and JSON Schema `$ref`s. The attacker's side is a registry that
answers with a reference cycle, 1,000 references, a missing subject, a chain deeper than the
limit, an import path outside the schema or garbage: each is a typed error, never a crash."""

from __future__ import annotations

import contextlib
import json
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pool, message_factory
from hypothesis import given, settings
from hypothesis import strategies as st

from app.envelope.model import new_envelope
from app.errors import ConfigError, PrismError, SchemaReferenceError, SchemaReferencesError, SchemaValidationError
from app.schema.payload_check import validator_for
from app.schema.protoparse import compile_proto
from app.schema.references import MAX_REFERENCE_DEPTH, MAX_REFERENCES, resolve_fetched
from app.schema.resolve import ReferencesUnresolvable, SchemaResolutionError, resolve_schema_config
from app.sdk.schemas import MASK, SchemaResolver
from app.topology import EnrichStage
from app.worker.pipeline import resolve_schema
from tests.sdk.test_publish_validation import client_with_recorder
from tests.support import creds, serve_http

CURRENCY = 'syntax = "proto3";\npackage common;\nenum Currency {\n  CURRENCY_UNSPECIFIED = 0;\n  EUR = 1;\n}\n'
MONEY = ('syntax = "proto3";\npackage common;\nimport "common/currency.proto";\n'
         'message Money {\n  Currency currency = 1;\n  int64 units = 2;\n}\n')
CUSTOMER = ('syntax = "proto3";\npackage crm;\nimport "prism/annotations.proto";\n'
            'message Customer {\n  string id = 1;\n  string email = 2 [(prism.pii) = "email"];\n}\n')
ORDER = ('syntax = "proto3";\npackage orders.v1;\nimport "common/money.proto";\nimport "crm/customer.proto";\n'
         'message Order {\n  string order_id = 1;\n  common.Money total = 2;\n  crm.Customer customer = 3;\n}\n')
IMPORTS = {"common/currency.proto", "common/money.proto", "crm/customer.proto"}


@pytest.fixture
def as_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    """Read the registry as its read-only user, from the environment like a deployed worker."""
    user, password = creds("reader")
    monkeypatch.delenv("PRISM_REGISTRY_TOKEN", raising=False)
    monkeypatch.setenv("PRISM_REGISTRY_USER", user)
    monkeypatch.setenv("PRISM_REGISTRY_PASSWORD", password)


def register_orders(registry: Any, subject: str = "orders.created") -> Any:
    registry.register("currency", CURRENCY, "PROTOBUF")
    registry.register("money", MONEY, "PROTOBUF",
                      references=[{"name": "common/currency.proto", "subject": "currency", "version": 1}])
    registry.register("customer", CUSTOMER, "PROTOBUF")
    refs = [{"name": "common/money.proto", "subject": "money", "version": 1},
            {"name": "crm/customer.proto", "subject": "customer", "version": "latest"}]
    return registry.register(subject, ORDER, "PROTOBUF", references=refs).version


def order_class(resolved: Any) -> Any:
    pool = descriptor_pool.DescriptorPool()
    for fd in compile_proto(ORDER, imports=resolved.imports).fds.file:
        pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("orders.v1.Order"))


def an_order(resolved: Any) -> Any:
    order = order_class(resolved)(order_id="o-1")
    order.total.currency, order.total.units = 1, 42
    order.customer.id, order.customer.email = "c-1", "alice@example.invalid"
    return order


def test_protobuf_schema_importing_two_subjects_resolves_validates_and_decodes(live_server, as_reader,
                                                                                tmp_path) -> None:  # type: ignore[no-untyped-def]
    stored = register_orders(live_server.registry)
    for kind in ("prism", "confluent"):
        r = resolve_schema_config({"registry_type": kind, "url": live_server.url, "subject": "orders.created",
                                   "version": "1"})
        assert r.name == "orders.v1.Order" and set(r.imports) == IMPORTS
        # the registry's hash: text compiled with its imports plus the reference list
        assert r.hash == stored.hash and r.alternate_hashes == ()
        assert [(x.name, x.subject, x.version) for x in r.references] == [
            ("common/money.proto", "money", 1), ("crm/customer.proto", "customer", 1)]
        assert r.pii_fields == ("Customer.email",)  # the imported file's tag, found through the import
    validate = validator_for(r)
    good = an_order(r)
    assert validate(good.SerializeToString(), "application/protobuf") == []
    assert validate(b'{"orderId": "o", "total": {"currency": "EUR", "units": "3"}}', "application/json") == []
    bad = validate(b'{"total": {"currency": "GBP"}}', "application/json")
    assert bad and "GBP" in bad[0].message
    assert validate(b"\x12\x03\x08", "application/protobuf")  # truncated Money

    # The worker: the enrich stage's schema resolved at start-up, with its validators.
    settings = EnrichStage.model_validate({"trace": False, "schema": {
        "registry_type": "prism", "url": live_server.url, "subject": "orders.created", "version": "1",
        "validate_payloads": True}})
    info = resolve_schema(settings, tmp_path, validate=True)
    assert info is not None and info.hash == stored.hash and info.name == "orders.v1.Order"
    assert info.validator is not None and info.checker is not None
    assert info.validator(good.SerializeToString(), "application/protobuf") == []
    assert info.checker(b"\x12\x03\x08", "application/protobuf")
    # What the worker masks in a failed message's DLQ context: found through the imports
    from app.worker.pipeline import pii_finder

    finder = pii_finder(info)
    assert finder is not None
    assert finder.values(good.SerializeToString(), "application/protobuf") == ["alice@example.invalid"]


async def test_sdk_validates_before_publish_and_decodes_by_reference(live_server, as_reader) -> None:  # type: ignore[no-untyped-def]
    register_orders(live_server.registry)
    r = resolve_schema_config({"registry_type": "prism", "url": live_server.url, "subject": "orders.created"})
    good = an_order(r)
    client, rec = client_with_recorder(registry_url=live_server.url)
    with pytest.raises(SchemaValidationError):
        await client.publish("orders.created", {"total": {"units": "many"}}, schema_validation=True,
                             schema_version="1")
    assert rec.sent == []
    await client.publish("orders.created", good, schema_validation=True, schema_version="1")
    assert len(rec.sent) == 1

    # Consumer side: the envelope names the subject version and the hash the worker stamps.
    resolver = SchemaResolver(live_server.url)
    env = new_envelope("orders.created", good.SerializeToString(), namespace="orders")
    sc = env.ensure_schema()
    sc.schema_url, sc.schema_hash = f"{live_server.url}/v1/subjects/orders.created/versions/1", r.hash
    schema = await resolver.for_envelope(env)
    decoded = schema.decode(good.SerializeToString(), "application/protobuf")
    assert decoded.customer.email == "alice@example.invalid" and decoded.total.units == 42
    assert schema.is_pii_field("$.customer.email") and not schema.is_pii_field("$.total.units")
    assert schema.mask_pii(decoded).customer.email == MASK
    by_id = await SchemaResolver(live_server.url).by_id(schema.schema_id)
    assert set(by_id.resolved.imports) == IMPORTS and by_id.hash == r.hash
    sc.schema_hash = "sha256:" + "0" * 64
    with pytest.raises(SchemaReferenceError, match="claims schema hash"):
        await SchemaResolver(live_server.url).for_envelope(env)


ADDRESS_AVRO = json.dumps({"type": "record", "name": "Address", "namespace": "com.acme",
                           "fields": [{"name": "street", "type": "string", "prism.pii": "address"}]})
CUSTOMER_AVRO = json.dumps({"type": "record", "name": "Customer", "namespace": "com.acme.crm",
                            "fields": [{"name": "name", "type": "string"},
                                       {"name": "home", "type": "com.acme.Address"}]})
ADDRESS_JSON = json.dumps({"type": "object", "properties": {"street": {"type": "string", "x-prism-pii": "address"}},
                           "required": ["street"]})
CUSTOMER_JSON = json.dumps({"type": "object", "properties": {"name": {"type": "string"},
                                                             "home": {"$ref": "address.json"}}})


async def test_avro_and_json_schema_references_validate_and_decode(live_server, as_reader) -> None:  # type: ignore[no-untyped-def]
    import io

    import fastavro

    from app.schema.canonical import schema_hash

    reg = live_server.registry
    reg.register("address-avro", ADDRESS_AVRO, "AVRO")
    avro = reg.register("customer-avro", CUSTOMER_AVRO, "AVRO", references=[
        {"name": "com.acme.Address", "subject": "address-avro", "version": 1}]).version
    reg.register("address-json", ADDRESS_JSON, "JSON")
    js = reg.register("customer-json", CUSTOMER_JSON, "JSON", references=[
        {"name": "address.json", "subject": "address-json", "version": 1}]).version

    a = resolve_schema_config({"registry_type": "prism", "url": live_server.url, "subject": "customer-avro"})
    assert a.hash == avro.hash and a.alternate_hashes == (schema_hash("AVRO", CUSTOMER_AVRO),)
    assert a.name == "com.acme.crm.Customer" and any(p.endswith("street") for p in a.pii_fields)
    check = validator_for(a)
    assert check(b'{"name": "n", "home": {"street": "s"}}', "application/json") == []
    assert check(b'{"name": "n", "home": {"street": 5}}', "application/json")[0].path == "$.home.street"
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(json.loads(a.schema_text)), {"name": "n", "home": {"street": "s"}})
    resolver = SchemaResolver(live_server.url)
    schema = await resolver.get("customer-avro", 1)
    assert schema.decode(buf.getvalue()) == {"name": "n", "home": {"street": "s"}}
    assert schema.is_pii_field("$.home.street")
    # an envelope stamped with the text-only hash (what Python stamped before) still resolves
    assert schema.accepts_hash(schema_hash("AVRO", CUSTOMER_AVRO)) and schema.accepts_hash(avro.hash)

    j = resolve_schema_config({"registry_type": "confluent", "url": live_server.url, "subject": "customer-json"})
    assert j.hash == js.hash
    check = validator_for(j)
    assert check(b'{"name": "n", "home": {"street": "s"}}', "application/json") == []
    assert check(b'{"name": "n", "home": {}}', "application/json")[0].path == "$.home"
    schema = await resolver.get("customer-json", 1)
    assert schema.mask_pii({"name": "n", "home": {"street": "s"}}) == {"name": "n", "home": {"street": MASK}}


def test_deep_import_chain_in_the_real_registry(live_server, as_reader) -> None:  # type: ignore[no-untyped-def]
    """Ten files, each importing the previous one: resolved transitively, every file an import."""
    reg = live_server.registry
    for i in range(10):
        text = 'syntax = "proto3";\npackage chain;\n' + (f'import "chain/m{i - 1}.proto";\n' if i else "") + \
            f"message M{i} {{\n" + (f"  M{i - 1} prev = 1;\n" if i else "  string leaf = 1;\n") + "}\n"
        refs = [{"name": f"chain/m{i - 1}.proto", "subject": f"m{i - 1}", "version": 1}] if i else []
        reg.register(f"m{i}", text, "PROTOBUF", references=refs)
    r = resolve_schema_config({"registry_type": "prism", "url": live_server.url, "subject": "m9"})
    assert len(r.imports) == 9 and r.name == "chain.M9"
    assert validator_for(r)(b"\x0a\x02\x0a\x00", "application/protobuf") == []


# --------------------------------------------------------------------------------------------- hostile


class FakeRegistry:
    """A registry that answers what the test says: `docs[(subject, version)]` is the JSON body of
    `/v1/subjects/{s}/versions/{v}` (and of the Confluent route); anything else is 404."""

    def __init__(self) -> None:
        self.docs: dict[tuple[str, str], Any] = {}
        self.requests = 0

    def add(self, subject: str, text: str, refs: list[dict[str, Any]] | None = None, fmt: str = "protobuf",
            version: int = 1) -> None:
        doc = {"subject": subject, "version": version, "id": len(self.docs) + 1, "format": fmt, "schema": text,
               "schemaType": fmt.upper()}
        if refs:
            doc["references"] = refs
        self.docs[(subject, str(version))] = doc
        self.docs.setdefault((subject, "latest"), doc)


@contextlib.contextmanager
def fake_registry(fake: FakeRegistry) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            fake.requests += 1
            parts = [urllib.parse.unquote(p) for p in urllib.parse.urlsplit(self.path).path.split("/") if p]
            if parts[:1] == ["v1"]:
                parts = parts[1:]
            body: Any = None
            if parts[:1] == ["policies"] or parts[:1] == ["config"]:
                body = {"compatibility": "BACKWARD", "compatibilityLevel": "BACKWARD"}
            elif len(parts) == 4 and parts[0] == "subjects" and parts[2] == "versions":
                body = fake.docs.get((parts[1], parts[3]))
            raw = json.dumps(body).encode() if body is not None else b'{"error_code": 40401}'
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args: Any) -> None:
            pass

    with serve_http(Handler) as url:
        yield url


def _ref(name: str, subject: str, version: int | str = 1) -> dict[str, Any]:
    return {"name": name, "subject": subject, "version": version}


def _proto(pkg: str, imports: list[str]) -> str:
    return f'syntax = "proto3";\npackage {pkg};\n' + "".join(f'import "{i}";\n' for i in imports) + \
        "message M {\n  string s = 1;\n}\n"


def hostile_registries() -> dict[str, tuple[FakeRegistry, str]]:
    """name -> (registry, what the error says)."""
    out: dict[str, tuple[FakeRegistry, str]] = {}
    f = FakeRegistry()  # a -> b -> a
    f.add("top", _proto("top", ["a.proto"]), [_ref("a.proto", "a")])
    f.add("a", _proto("a", ["b.proto"]), [_ref("b.proto", "b")])
    f.add("b", _proto("b", ["a.proto"]), [_ref("a.proto", "a")])
    out["cycle"] = (f, "cycle")
    f = FakeRegistry()  # the schema references itself
    f.add("top", _proto("top", ["top.proto"]), [_ref("top.proto", "top")])
    out["self"] = (f, "cycle")
    f = FakeRegistry()  # 1,000 references
    f.add("leaf", _proto("leaf", []))
    f.add("top", _proto("top", []), [_ref(f"r{i}.proto", "leaf") for i in range(1000)])
    out["thousand"] = (f, f"more than {MAX_REFERENCES}")
    f = FakeRegistry()
    f.add("top", _proto("top", ["gone.proto"]), [_ref("gone.proto", "no-such-subject")])
    out["missing"] = (f, "cannot be read")
    f = FakeRegistry()  # a chain deeper than the limit
    for i in range(MAX_REFERENCE_DEPTH + 5):
        f.add(f"c{i}", _proto(f"c{i}", [f"c{i + 1}.proto"]), [_ref(f"c{i + 1}.proto", f"c{i + 1}")])
    f.add("top", _proto("top", ["c0.proto"]), [_ref("c0.proto", "c0")])
    out["deep"] = (f, f"more than {MAX_REFERENCE_DEPTH} deep")
    f = FakeRegistry()  # an import path that walks out of the schema's directory
    f.add("evil", _proto("evil", []))
    f.add("top", _proto("top", ["../../../../tmp/prism-evil.proto"]),
          [_ref("../../../../tmp/prism-evil.proto", "evil")])
    out["traversal"] = (f, "relative path inside the schema")
    f = FakeRegistry()  # a referenced "schema" that is not text, references that are not a list of objects
    f.add("top", _proto("top", ["x.proto"]), [_ref("x.proto", "x")])
    f.docs[("x", "1")] = {"version": 1, "schema": {"not": "text"}}
    out["garbage"] = (f, "cannot be read")
    f = FakeRegistry()
    f.add("top", _proto("top", []), [_ref("x.proto", "x")])
    f.docs[("x", "1")] = {"version": 1, "schema": "syntax", "references": "nonsense"}
    out["bad-references"] = (f, "not an object")
    f = FakeRegistry()  # a reference that resolves but does not define what the import needs
    f.add("x", 'syntax = "proto3";\npackage x;\nmessage Other {}\n')
    f.add("top", 'syntax = "proto3";\npackage top;\nimport "x.proto";\nmessage M {\n  x.Missing m = 1;\n}\n',
          [_ref("x.proto", "x")])
    out["not-compiling"] = (f, "does not compile with its references")
    return out


@pytest.mark.parametrize("case", sorted(hostile_registries()))
async def test_hostile_registry_answers_are_typed_errors(case: str) -> None:
    fake, says = hostile_registries()[case]
    with fake_registry(fake) as url:
        for kind in ("prism", "confluent"):
            with pytest.raises(ReferencesUnresolvable) as e:
                resolve_schema_config({"registry_type": kind, "url": url, "subject": "top"})
            assert isinstance(e.value, PrismError) and e.value.code == "schema_references_invalid"
            assert says in str(e.value) and e.value.path == "schema.references"
        assert fake.requests < 2 * (MAX_REFERENCES + 10) + 10  # bounded: never one fetch per reference of 1,000
        # the worker: a start-up ConfigError naming the cause
        settings = EnrichStage.model_validate({"trace": False, "schema": {
            "registry_type": "prism", "url": url, "subject": "top"}})
        with pytest.raises(ConfigError, match=says.split()[0]):
            resolve_schema(settings, Path("."), validate=True)
        # the SDK's decoder: a SchemaReferenceError, the message left to the consumer
        with pytest.raises(SchemaReferenceError):
            await SchemaResolver(url).get("top", 1)
        # the SDK's validate-before-publish: the typed error, nothing sent
        client, rec = client_with_recorder(registry_url=url)
        with pytest.raises(SchemaReferencesError):
            await client.publish("top", b"\x0a\x01x", schema_validation=True, schema_version="1")
        assert rec.sent == []
    assert not Path("/tmp/prism-evil.proto").exists()


# A registry answer is a tree the attacker draws: any graph of references, any names and
# versions, any texts. Resolving it gives a schema or a typed error, nothing else.
_names = st.sampled_from(["a.proto", "b.proto", "c/d.proto", "../x.proto", "/abs.proto", "", "a"])
_subjects = st.sampled_from(["s0", "s1", "s2", "s3", "missing"])
_versions = st.one_of(st.sampled_from([1, 2, "latest", -1, 0, "x", None, True]), st.integers(-3, 5))
_refs = st.lists(st.fixed_dictionaries({"name": _names, "subject": _subjects, "version": _versions}), max_size=4)
_texts = st.sampled_from([_proto("p", []), _proto("q", ["a.proto"]), "garbage", '{"type": "string"}', ""])


@settings(max_examples=200, deadline=None)
@given(fmt=st.sampled_from(["PROTOBUF", "AVRO", "JSON"]), graph=st.dictionaries(
    _subjects, st.tuples(_texts, _refs), max_size=4), root_refs=_refs)
def test_any_reference_graph_resolves_or_is_a_typed_error(fmt: str, graph: dict[str, Any], root_refs: Any) -> None:
    calls = [0]

    def fetch(subject: str, version: str) -> dict[str, Any]:
        calls[0] += 1
        if subject not in graph:
            raise SchemaResolutionError(f"GET {subject} failed: HTTP Error 404")
        text, refs = graph[subject]
        return {"schema": text, "version": 1, "references": refs}

    try:
        got = resolve_fetched(fmt, _proto("root", []), root_refs, fetch)
    except ReferencesUnresolvable as e:
        assert e.code == "schema_references_invalid"
    else:
        assert isinstance(got.text, str) and all(isinstance(k, str) for k in got.imports)
    assert calls[0] <= MAX_REFERENCES


def test_registry_refuses_an_import_path_outside_the_schema(registry, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """protoc reads the references as files of a temporary tree: a reference name that climbs out
    of it (or is absolute) would have the registry write a file anywhere. Refused as 42201."""
    from app.schema.registry import InvalidSchema

    registry.register("evil", _proto("evil", []), "PROTOBUF")
    target = tmp_path / "written.proto"
    for name in (f"../../../../../../..{target}", str(target), "a/../../b.proto"):
        with pytest.raises(InvalidSchema, match="relative path inside the schema"):
            registry.register("top", _proto("top", [name]), "PROTOBUF", references=[_ref(name, "evil")])
    assert not target.exists()
    # a directory and a file of one name cannot both be imports: refused, not an OSError
    registry.register("x", _proto("x", []), "PROTOBUF")
    with pytest.raises(InvalidSchema, match="cannot be laid out"):
        registry.register("top", _proto("top", ["d", "d/e.proto"]), "PROTOBUF",
                          references=[_ref("d", "x"), _ref("d/e.proto", "evil")])

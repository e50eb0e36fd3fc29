"""Schema validation rolled out per RFC-030 "Migration Path": `validation: off | warn | strict`
per topology and per namespace, checked at load with every problem at once; `warn` logs the
field path (event `schema_validation_failed`), counts and forwards with the
`prism-schema-validation` header; `strict` dead-letters as `schema_validation_failed`."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from app.agents.chain import Chain, Outcome
from app.agents.enrich import VALIDATION_HEADER, Enrich
from app.agents.publish import Publisher
from app.envelope import new_envelope
from app.errors import ConfigError, SchemaValidationError
from app.topology import load_topology
from app.worker.pipeline import resolve_schema
from tests.agents.conftest import make_msg

SCHEMA = {"title": "Order", "type": "object", "required": ["order_id"],
          "properties": {"order_id": {"type": "string"},
                         "customer_email": {"type": "string", "x-prism-pii": "email"},
                         "items": {"type": "array", "items": {"type": "object",
                                                              "properties": {"price": {"type": "number"}}}}}}
BAD = {"order_id": "o-1", "customer_email": "alice@example.invalid", "items": [{"price": 1}, {"price": 2},
                                                                                {"price": "free"}]}


def write_topology(tmp: Path, extra: str = "", *, schema: bool = True, validate_payloads: bool = False) -> Path:
    (tmp / "order.json").write_text(json.dumps(SCHEMA))
    enrich = ("  - enrich:\n      trace: false\n      schema: {registry_type: file, path: order.json, version: v1"
              + (", validate_payloads: true" if validate_payloads else "") + "}\n") if schema else ""
    p = tmp / "t.yaml"
    p.write_text("name: t\nnamespace: order-events\nsources: [{topic: orders.created, partitions: 1}]\n"
                 "stages:\n  - normalize: {}\n" + enrich + "outputs: {layouts: [v3], sign: false}\n"
                 "archive: {enabled: false}\n" + extra)
    return p


def enrich_for(topology_path: Path) -> Enrich:
    topo = load_topology(topology_path)
    default, per_ns = topo.validation_modes()
    schema = resolve_schema(topo.stage("enrich"), topo.base_dir, validate=True)
    return Enrich(trace=False, schema=schema, validation=default, namespace_validation=per_ns)


def msg_for(payload, namespace: str = "order-events", headers=None):
    m = make_msg(b"", headers)
    m.envelope = new_envelope("orders.created", payload, namespace=namespace)
    return m


def test_every_validation_problem_is_reported_at_load(tmp_path):
    path = write_topology(tmp_path, "validation: warn\nnamespaces:\n  billing: {validation: strict}\n"
                                    "  'bad name!': {validation: warn}\n", schema=False)
    with pytest.raises(ConfigError) as e:
        load_topology(path)
    text = str(e.value)
    assert "validation: warn needs a schema" in text and "namespaces.billing.validation: strict needs a schema" in text
    assert "not a namespace name" in text  # all three in one load, like the producers: checks
    path = write_topology(tmp_path, "validation: loud\n")
    with pytest.raises(ConfigError, match=r"validation: Input should be 'off', 'warn' or 'strict'"):
        load_topology(path)
    path = write_topology(tmp_path, "validation: warn\n", validate_payloads=True)
    with pytest.raises(ConfigError, match="validate_payloads"):
        load_topology(path)
    assert load_topology(write_topology(tmp_path)).validation_modes() == ("off", {})


def test_warn_logs_counts_and_marks_the_outputs(tmp_path, caplog):
    stage = enrich_for(write_topology(tmp_path, "validation: warn\n"))
    good, bad = msg_for({"order_id": "o-2", "items": []}), msg_for(BAD)
    with caplog.at_level(logging.WARNING, logger="prism.worker"):
        stage.process(good)
        stage.process(bad)
    assert good.out_headers is None
    assert bad.out_headers == [(VALIDATION_HEADER, b"failed; $.items[2].price")]
    (rec,) = [r for r in caplog.records if getattr(r, "event", "") == "schema_validation_failed"]
    assert rec.field_path == "$.items[2].price" and rec.validation_mode == "warn" and rec.namespace == "order-events"
    assert "free" not in rec.getMessage() and "alice" not in rec.getMessage()  # the path and rule, never a value
    assert stage.drain_validations() == {("order-events", "v1", "warn", "valid"): 1,
                                         ("order-events", "v1", "warn", "invalid"): 1}
    assert stage.drain_validations() == {}


def test_strict_dead_letters_with_the_path_and_namespaces_override(tmp_path):
    stage = enrich_for(write_topology(tmp_path, "validation: strict\nnamespaces:\n  legacy: {validation: off}\n"
                                                "  billing: {validation: warn}\n"))
    with pytest.raises(SchemaValidationError) as e:
        stage.process(msg_for(BAD))
    assert e.value.code == "schema_validation_failed" and e.value.path == "$.items[2].price"
    legacy = msg_for(BAD, namespace="legacy")
    stage.process(legacy)  # off: not even read
    billing = msg_for(BAD, namespace="billing")
    stage.process(billing)
    assert billing.out_headers and stage.mode_for("billing") == "warn"
    assert stage.drain_validations() == {("order-events", "v1", "strict", "invalid"): 1,
                                         ("billing", "v1", "warn", "invalid"): 1}


def test_chain_dlq_reason_and_published_header(tmp_path):
    topo = load_topology(write_topology(tmp_path, "validation: warn\nnamespaces:\n  billing: {validation: strict}\n"))
    stage = enrich_for(write_topology(tmp_path, "validation: warn\nnamespaces:\n  billing: {validation: strict}\n"))
    chain = Chain([stage], dlq_topic_for=lambda t: t + ".dlq")
    strict = msg_for(BAD, namespace="billing")
    res = chain.run(strict)
    assert res.outcome is Outcome.DLQ and res.reason == "schema_validation_failed"
    ctx = dict(res.dlq.headers)
    assert b"$.items[2].price" in ctx["prism.errors.exception.message"]
    assert not any(k == VALIDATION_HEADER for k, _ in res.dlq.headers)  # the DLQ copy is the record as received
    forged = msg_for({"order_id": "o-3", "items": []}, headers=[(VALIDATION_HEADER, b"failed; $.x"), ("x-app", b"1")])
    warned = msg_for(BAD, headers=[(VALIDATION_HEADER, b"ok")])
    pub = Publisher(topo, worker_key=None)
    for m in (forged, warned):
        assert chain.run(m).outcome is Outcome.EMITTED
    (out,) = pub.emissions(forged)
    assert [k for k, _ in out.record.headers].count(VALIDATION_HEADER) == 0  # a producer's verdict is dropped
    (out,) = pub.emissions(warned)
    assert [v for k, v in out.record.headers if k == VALIDATION_HEADER] == [b"failed; $.items[2].price"]


def test_off_never_builds_a_validator(tmp_path):
    topo = load_topology(write_topology(tmp_path))
    schema = resolve_schema(topo.stage("enrich"), topo.base_dir)
    assert schema is not None and schema.validator is None
    stage = Enrich(trace=False, schema=schema, validation="warn")  # no validator: nothing to validate with
    m = msg_for(BAD)
    stage.process(m)
    assert m.out_headers is None and stage.drain_validations() == {}

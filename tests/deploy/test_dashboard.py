"""deploy/grafana/prism-dashboard.json: every panel query is valid PromQL and uses only metrics
(and labels) that a running worker and a running registry export - a renamed metric or label
turns a panel blank silently, so this test is the only thing that notices."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from typing import Any

import promql_parser
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.conftest import DEPLOY, KUBE_STATE_METRICS, archive_metrics, as_scraped

DASHBOARD = DEPLOY / "grafana" / "prism-dashboard.json"
#: Grafana's built-in interval variables, replaced by a duration for parsing.
GRAFANA_INTERVALS = re.compile(r"\$__(rate_interval|interval|range)\b|\$\{__(rate_interval|interval|range)\}")
#: Sample names a metric family of each type exposes (prometheus_client's suffixes).
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
            "gauge": ("",), "summary": ("", "_count", "_sum", "_created"), "info": ("_info",),
            "unknown": ("",)}


def exported(text: str) -> dict[str, set[str]]:
    """sample name -> label names seen on it (empty for a family with no labelled child yet)."""
    out: dict[str, set[str]] = defaultdict(set)
    for fam in text_string_to_metric_families(text):
        for suffix in SUFFIXES[fam.type]:
            out.setdefault(fam.name + suffix, set())
        for s in fam.samples:
            out[s.name] |= set(s.labels)
    return out


@pytest.fixture(scope="module")
def worker_metrics() -> dict[str, set[str]]:
    """The worker's own metric registry (what its /metrics serves), with one sample per family."""
    from app.worker.observe import Observer

    m = Observer.from_env({}).metrics
    m.message_in("orders.created", "normalize")
    m.message_out("orders.created.v3", "publish")
    m.dlq("orders.created", "validate", "bad_timestamp")
    m.dedup_hit("orders.created", "dedup")
    m.expired("orders.created", "policy")
    m.signature_failure("orders.created", "bad_signature")
    m.auth_failure("orders.created", "expired_token")
    m.observe_latency("orders.created", "validate", 0.0002)
    m.set_consumer_lag("orders.created", 0, 12)
    m.set_table_size("dedup", 3)
    m.newer_envelope_version("orders.created", 3)
    m.producer_sdk_output("orders.created", "prism-python/0.1.0")
    m.schema_validation("orders.created", "order-events", "v2", "warn", "invalid")
    return exported(m.exposition().decode())


@pytest.fixture(scope="module")
def sdk_metrics() -> dict[str, set[str]]:
    """What a producer/consumer serving `PrismClient(metrics=...)` exports (app/sdk/validation.py)."""
    from prometheus_client import generate_latest

    from app.sdk.validation import SchemaMetrics

    m = SchemaMetrics()
    m.validated("order-events", "v2", False, 0.0001)
    m.received_message("order-events", "v2", "match")
    return exported(generate_latest(m.registry).decode())




@pytest.fixture(scope="module")
def registry_metrics(tmp_path_factory) -> dict[str, set[str]]:
    """A real registry app's GET /metrics after a registration, a compatibility check and rejections."""
    from fastapi.testclient import TestClient

    from app.schema.service import create_app
    from app.security.http_auth import auth_from_settings
    from tests.support import auth_headers, write_users_file

    db = tmp_path_factory.mktemp("registry") / "r.db"
    auth = auth_from_settings(users_file=write_users_file(db.parent / "users.yaml"), jwt_config=None,
                              allow_anonymous=None, realm="prism-schema-registry", where="test")
    with TestClient(create_app(store_url=f"sqlite:///{db}", auth=auth), headers=auth_headers("admin")) as client:
        schema = json.dumps({"type": "object", "properties": {"id": {"type": "integer"}}})
        r = client.post("/subjects/orders-value/versions", json={"schema": schema, "schemaType": "JSON"})
        assert r.status_code == 200, r.text
        r = client.post("/compatibility/subjects/orders-value/versions/latest",
                        json={"schema": schema, "schemaType": "JSON"})
        assert r.status_code == 200, r.text
        assert client.post("/subjects/orders-value/versions",
                           json={"schema": "{not json", "schemaType": "JSON"}).status_code >= 400
        assert client.put("/v1/policies/users", json={"pii_policy": "enforce"}).status_code == 200
        pii = 'syntax = "proto3";\nmessage User { string user_id = 1; string email = 2; }\n'
        assert client.post("/v1/schemas", json={"topic": "users.profile", "namespace": "users", "format": "protobuf",
                                                "schema": pii}).status_code == 422  # an enforcing PII policy
        r = client.get("/metrics")
        assert r.status_code == 200
        return exported(r.text)


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def queries() -> list[tuple[str, str]]:
    out = [(p["title"], t["expr"]) for p in panels() for t in p["targets"]]
    for var in dashboard()["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", var["definition"])
            assert m, var["definition"]
            out.append((f"variable ${var['name']}", f"count by ({m.group(2)}) ({m.group(1)})"))
    return out


def analyse(expr: str) -> tuple[list[tuple[str, set[str]]], set[str]]:
    """(selectors: metric name + matcher labels, labels named in by(...)) of one query."""
    ast = promql_parser.parse(GRAFANA_INTERVALS.sub("5m", expr))
    selectors: list[tuple[str, set[str]]] = []
    grouping: set[str] = set()

    def visit(node: Any) -> None:
        kind = type(node).__name__
        if kind == "VectorSelector":
            selectors.append((node.name, {m.name for m in node.matchers.matchers}))
        elif kind == "AggregateExpr" and node.modifier is not None:
            grouping.update(node.modifier.labels)

    promql_parser.walk(ast, visit)
    return selectors, grouping


def test_dashboard_is_importable_grafana_json():
    d = dashboard()
    assert d["uid"] and d["title"] and d["schemaVersion"] >= 36
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for p in d["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine
    for p in panels():
        assert p["targets"] and p["datasource"]["uid"] == "${datasource}", p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
    assert next(v["name"] for v in d["templating"]["list"]) == "datasource"


def test_dashboard_covers_what_operators_need():
    titles = " | ".join(p["title"] for p in panels()).lower()
    for topic in ("outcomes", "dlq by reason", "consumer lag", "stage latency p99", "signature failures",
                  "authentication failures", "requests by status", "compatibility verdicts",
                  "namespace and schema version", "schema validations", "sdk publish-time validations",
                  "subscribers by schema version"):
        assert topic in titles, topic


def test_every_query_parses_and_uses_only_exported_metrics_and_labels(worker_metrics, registry_metrics,
                                                                      sdk_metrics):
    from app.topology import STAGE_ORDER

    available = {**worker_metrics, **registry_metrics, **sdk_metrics}
    # as Prometheus stores them: target labels (pod, instance, ...), `up`, kube-state-metrics
    available = as_scraped({**available, **archive_metrics()})
    assert "prism_stage_latency_seconds_bucket" in available and "prism_schema_registry_requests_total" in available
    used: set[str] = set()
    for title, expr in queries():
        try:
            selectors, grouping = analyse(expr)
        except Exception as exc:  # the parser's own error type is a plain ValueError/RuntimeError
            pytest.fail(f"{title}: not valid PromQL: {exc}\n  {expr}")
        assert selectors, f"{title}: no metric in {expr}"
        labels_in_query: set[str] = set()
        for name, matcher_labels in selectors:
            assert name in available, f"{title}: {name} is not exported by the worker or the registry\n  {expr}"
            used.add(name)
            labels = available[name] | ({"le"} if name.endswith("_bucket") else set())
            labels_in_query |= labels
            assert matcher_labels <= labels, f"{title}: {name} has no label(s) {matcher_labels - labels}"
        assert grouping <= labels_in_query, f"{title}: groups by {grouping - labels_in_query}, not a label of its metrics"
        if 'stage="' in expr:  # the first stage of every topology, where inputs are counted
            assert 'stage="normalize"' in expr or 'stage="publish"' in expr
    assert STAGE_ORDER[0] == "normalize"
    # every family the code exports is on the dashboard, or deliberately left off
    families = {re.sub(r"_(total|bucket|count|sum|created)$", "", n) for n in used}
    left_off = {"prism_schema_registry_cache_lookups"}  # the hit-ratio panel summarises it
    for name in available:
        base = re.sub(r"_(total|bucket|count|sum|created)$", "", name)
        if name.startswith(("prism_", "process_")) and base not in left_off | {"process_virtual_memory_bytes",
                                                                            "process_max_fds", "process_start_time_seconds"}:
            assert base in families, f"{name} is exported but on no panel"


def test_a_misspelt_metric_or_label_would_be_caught(worker_metrics):
    (name, matchers), = analyse('rate(prism_dlq_message_total{reason="x"}[$__rate_interval])')[0]
    assert name not in worker_metrics
    (name, matchers), = analyse('rate(prism_dlq_messages_total{reasn="x"}[5m])')[0]
    assert name in worker_metrics and not matchers <= worker_metrics[name]
    with pytest.raises(Exception):  # noqa: B017 - whatever the parser raises
        analyse("sum by (reason (rate(prism_dlq_messages_total[5m]))")


def test_worker_panels_filter_by_pod_and_instance_and_sre_rows_exist():
    """An SRE narrows the worker panels to one pod or instance, reads CPU and memory from the
    process_* metrics, and sees the archive tap and the lake job; the emitted series follow the
    source-topic filter (outputs are named `<source topic>.<layout>`)."""
    d = dashboard()
    variables = {v["name"]: v for v in d["templating"]["list"]}
    for name in ("pod", "instance"):
        assert variables[name]["includeAll"] and variables[name]["multi"], name
        # no allValue: "All" means the listed worker pods, not every pod Prometheus knows
        assert "allValue" not in variables[name], name
    worker = {"prism_messages_in_total", "prism_messages_out_total", "prism_dlq_messages_total",
              "prism_stage_latency_seconds_bucket", "prism_consumer_lag", "process_cpu_seconds_total",
              "prism_archive_records_total"}
    for title, expr in queries():
        if title.startswith("variable") or "and on (pod)" in expr:
            continue
        for name, _ in analyse(expr)[0]:
            if name in worker:
                assert 'pod=~"$pod"' in expr and 'instance=~"$instance"' in expr, (title, expr)
    emitted = [e for t, e in queries() if "prism_messages_out_total" in e and 'stage="publish"' in e]
    assert emitted and all("$topic" in e for e in emitted), emitted
    titles = " | ".join(p["title"] for p in panels()).lower()
    for topic in ("worker cpu", "worker memory", "registry cpu", "registry memory", "archived records",
                  "archive rolls", "lake compaction"):
        assert topic in titles, topic
    used = {name for _, expr in queries() for name, _ in analyse(expr)[0]}
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes"} <= used
    assert used & set(KUBE_STATE_METRICS), "the lake panels read kube-state-metrics"

"""Worker metrics: counts add up, registries are isolated, the label allowlist is a real
cardinality guard, and /metrics serves the same numbers over HTTP."""

from __future__ import annotations

import random

import pytest
from aiohttp.test_utils import TestClient, TestServer
from aiohttp.web import Application
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from app.envelope import new_envelope
from app.errors import ConfigError
from app.observability.health import HealthState, route_table
from app.observability.metrics import CONTENT_TYPE, OTHER, PipelineMetrics
from app.observability.redaction import Redactor
from app.observability.tracing import configure_tracing, stage_span


def samples(exposition: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Parse the exposition text the way Prometheus would."""
    out = {}
    for fam in text_string_to_metric_families(exposition.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(parsed, name, **labels) -> float:
    want = set(labels.items())
    return sum(v for (n, lbls), v in parsed.items() if n == name and want <= set(lbls))


def env(topic="orders.created", **labels):
    return new_envelope(topic, b"x", namespace="orders", labels=labels or None)


def test_counts_add_up_to_what_was_processed():
    m = PipelineMetrics(label_allowlist=["tenant"])
    rng = random.Random(7)
    expected = {"emitted": 0, "dlq": 0, "expired": 0, "duplicate": 0}
    tenants = ["acme", "globex", "initech"]
    per_tenant_in = dict.fromkeys(tenants, 0)
    tracer = configure_tracing("none").tracer()
    for _ in range(500):
        outcome = rng.choice(list(expected))
        tenant = rng.choice(tenants)
        expected[outcome] += 1
        per_tenant_in[tenant] += 1
        with stage_span(tracer, "process", env(tenant=tenant), "orders.created", 0, metrics=m) as s:
            if outcome == "emitted":
                s.emitted("orders.created.v3")
            elif outcome == "dlq":
                s.dlq(rng.choice(["bad_signature", "auth_failed"]))
            elif outcome == "expired":
                s.expired()
            else:
                s.duplicate()
    p = samples(m.exposition())
    assert total(p, "prism_messages_in_total", stage="process") == 500
    assert total(p, "prism_messages_out_total", topic="orders.created.v3") == expected["emitted"]
    assert total(p, "prism_dlq_messages_total") == expected["dlq"]
    assert (total(p, "prism_dlq_messages_total", reason="bad_signature")
            + total(p, "prism_dlq_messages_total", reason="auth_failed")) == expected["dlq"]
    assert total(p, "prism_expired_messages_total") == expected["expired"]
    assert total(p, "prism_dedup_hits_total") == expected["duplicate"]
    # in = out + dlq + expired + duplicate: every message is accounted for exactly once
    assert sum(expected.values()) == 500
    assert total(p, "prism_stage_latency_seconds_count", stage="process") == 500
    for t in tenants:
        assert total(p, "prism_messages_in_total", tenant=t) == per_tenant_in[t]


def test_failure_counters_gauges_and_partition_removal():
    m = PipelineMetrics()
    for _ in range(3):
        m.signature_failure("orders", "bad_signature")
    m.signature_failure("orders", "unknown_key")
    m.auth_failure("orders", "token_expired")
    m.set_consumer_lag("orders", 0, 12)
    m.set_consumer_lag("orders", 1, -5)  # clamped: lag is never negative
    m.set_table_size("dedup", 1000)
    p = samples(m.exposition())
    assert p[("prism_signature_failures_total", (("reason", "bad_signature"), ("topic", "orders")))] == 3
    assert total(p, "prism_signature_failures_total") == 4
    assert total(p, "prism_auth_failures_total", reason="token_expired") == 1
    assert p[("prism_consumer_lag", (("partition", "0"), ("topic", "orders")))] == 12
    assert p[("prism_consumer_lag", (("partition", "1"), ("topic", "orders")))] == 0
    assert p[("prism_table_size", (("table", "dedup"),))] == 1000
    m.remove_partition("orders", 0)
    m.remove_partition("orders", 9)  # unknown: fine
    assert ("prism_consumer_lag", (("partition", "0"), ("topic", "orders"))) not in samples(m.exposition())


def test_registries_are_isolated_from_each_other_and_the_global_one():
    a, b = PipelineMetrics(), PipelineMetrics()
    a.message_in("t", "s")
    assert total(samples(a.exposition()), "prism_messages_in_total") == 1
    assert total(samples(b.exposition()), "prism_messages_in_total") == 0
    assert REGISTRY.get_sample_value("prism_messages_in_total", {"topic": "t", "stage": "s"}) is None


def test_non_allowlisted_labels_never_appear_in_the_exposition():
    m = PipelineMetrics(label_allowlist={"tenant": "tenant", "app.kubernetes.io/name": "app_name"})
    m.message_in("t", "s", env(tenant="acme", customer_id="cust-8812345", **{"app.kubernetes.io/name": "billing"}))
    m.dlq("t", "s", "bad_signature", env(customer_id="cust-99", session="s-1"))
    text = m.exposition().decode()
    assert 'tenant="acme"' in text and 'app_name="billing"' in text
    for forbidden in ("customer_id", "cust-8812345", "cust-99", "session", "s-1"):
        assert forbidden not in text


def test_label_values_are_truncated_and_capped():
    m = PipelineMetrics(label_allowlist=["tenant"], max_label_value_length=8, max_values_per_label=3)
    m.message_in("t", "s", env(tenant="x" * 100))
    for i in range(10):
        m.message_in("t", "s", env(tenant=f"t{i}"))
    p = samples(m.exposition())
    values = {dict(lbls)["tenant"] for (n, lbls) in p if n == "prism_messages_in_total"}
    assert values == {"x" * 8, "t0", "t1", OTHER}
    assert total(p, "prism_messages_in_total", tenant=OTHER) == 8
    assert total(p, "prism_messages_in_total") == 11


def test_reason_labels_are_normalized_and_capped():
    m = PipelineMetrics(max_reasons=2)
    m.dlq("t", "s", "Bad Signature!")
    m.dlq("t", "s", "auth_failed")
    m.dlq("t", "s", "something_else")
    p = samples(m.exposition())
    reasons = {dict(lbls)["reason"] for (n, lbls) in p if n == "prism_dlq_messages_total"}
    assert reasons == {"bad_signature_", "auth_failed", OTHER}


def test_secrets_in_allowlisted_labels_are_redacted():
    red = Redactor()
    red.register_secret("canary-label-secret-0042")
    m = PipelineMetrics(label_allowlist=["tenant", "note"], redactor=red)
    m.message_in("t", "s", env(tenant="canary-label-secret-0042", note="Bearer abcdefgh12345"))
    text = m.exposition().decode()
    assert "canary-label-secret-0042" not in text and "abcdefgh12345" not in text


@pytest.mark.parametrize("bad", [["topic"], ["__x"], {"a": "le"}, {"a": "x", "b": "x"}, ["1abc"]],
                         ids=["reserved", "dunder", "le", "collision", "digit_first"])
def test_bad_allowlist_is_a_config_error(bad):
    with pytest.raises(ConfigError):
        PipelineMetrics(label_allowlist=bad)


async def test_metrics_endpoint_scraped_during_a_run():
    m = PipelineMetrics()
    app = Application()
    app.add_routes(route_table(HealthState(), m))
    async with TestClient(TestServer(app)) as client:
        tracer = configure_tracing("none").tracer()
        published = 0
        for batch in range(3):
            for _ in range(40):
                with stage_span(tracer, "ingest", env(), "orders.created", batch % 2, metrics=m):
                    published += 1
            resp = await client.get("/metrics")  # scraped while the "worker" keeps going
            assert resp.status == 200
            assert resp.headers["Content-Type"] == CONTENT_TYPE
            p = samples(await resp.read())
            assert total(p, "prism_messages_in_total") == published
            assert total(p, "prism_messages_out_total") == published
        assert published == 120

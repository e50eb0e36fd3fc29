"""Topology keys added for source retention and DLQ attestations: parsed, defaulted, and
refused with the key path when wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from app.errors import ConfigError
from app.topology import load_topology, parse_duration_ms

ROOT = Path(__file__).resolve().parents[1]


def _load(tmp_path: Path, source: dict | None = None, dlq: dict | None = None):
    doc = yaml.safe_load((ROOT / "topologies/orders-created.yaml").read_text())
    doc["sources"][0].update(source or {})
    doc["dlq"].update(dlq or {})
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_topology(path)


@pytest.mark.parametrize("text, ms", [("500ms", 500), ("90s", 90_000), ("30m", 1_800_000), ("1h", 3_600_000),
                                      (" 2d ", 172_800_000), (60_000, 60_000)])
def test_durations(text, ms) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("bad", ["", "1", "1w", "-1h", "1.5h", "0m", True, 0, "h1"])
def test_bad_durations(bad) -> None:
    with pytest.raises(ValueError):
        parse_duration_ms(bad)


def test_source_retention_default_override_and_opt_out(tmp_path: Path) -> None:
    t = _load(tmp_path)
    assert t.topic_configs() == {"orders.created": {"retention.ms": "86400000"}}
    assert t.topic_configs(source_retention_ms=3_600_000) == {"orders.created": {"retention.ms": "3600000"}}
    assert _load(tmp_path, {"retention": "1h"}).source_retention_limits() == {"orders.created": 3_600_000}
    assert _load(tmp_path, {"retention": None}).topic_configs() == {}


@pytest.mark.parametrize("value, what", [("30s", "under one minute"), ("forever", "not a duration")])
def test_bad_source_retention_names_the_key(tmp_path: Path, value, what) -> None:
    with pytest.raises(ConfigError, match=rf"sources\[0\]\.retention.*{what}"):
        _load(tmp_path, {"retention": value})


def test_dlq_attestation_settings(tmp_path: Path) -> None:
    t = _load(tmp_path)
    assert t.dlq.attestation.enabled and t.dlq.attestation.max_age_s == 7 * 86400
    t = _load(tmp_path, dlq={"attestation": {"max_age_s": 3600, "trusted_keys": ["prism-worker-0"]}})
    assert t.dlq.attestation.trusted_keys == ["prism-worker-0"]
    with pytest.raises(ConfigError, match="max_age_s"):
        _load(tmp_path, dlq={"attestation": {"max_age_s": 5}})
    with pytest.raises(ConfigError, match=r"dlq\.attestation\.trust_everyone: Extra inputs"):
        _load(tmp_path, dlq={"attestation": {"trust_everyone": True}})


def test_output_signature_scope_defaults_to_batch_and_accepts_only_known_scopes(tmp_path: Path) -> None:
    assert _load(tmp_path).outputs.signature_scope == "batch"
    doc = yaml.safe_load((ROOT / "topologies/orders-created.yaml").read_text())
    for value, ok in (("v2", True), ("pair", True), ("batch", True), ("legacy", False), ("v3", False)):
        doc["outputs"]["signature_scope"] = value
        path = tmp_path / f"scope-{value}.yaml"
        path.write_text(yaml.safe_dump(doc))
        if ok:
            assert load_topology(path).outputs.signature_scope == value
        else:
            with pytest.raises(ConfigError, match=r"outputs\.signature_scope"):
                load_topology(path)


@pytest.mark.parametrize("value", [999, 900_001, "soon"])
def test_transaction_timeout_out_of_range_names_the_key(tmp_path: Path, value) -> None:
    doc = yaml.safe_load((ROOT / "topologies/orders-created.yaml").read_text())
    doc["transaction_timeout_ms"] = value
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="transaction_timeout_ms"):
        load_topology(path)
    doc["transaction_timeout_ms"] = 5_000
    path.write_text(yaml.safe_dump(doc))
    assert load_topology(path).transaction_timeout_ms == 5_000


def test_archive_roll_interval_is_bounded(tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "topologies/orders-created.yaml").read_text())
    doc["archive"]["roll_interval_s"] = 0.5
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=r"archive\.roll_interval_s"):
        load_topology(path)
    doc["archive"]["roll_interval_s"] = 5
    path.write_text(yaml.safe_dump(doc))
    assert load_topology(path).archive.roll_interval_s == 5

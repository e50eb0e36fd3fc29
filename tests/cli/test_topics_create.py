"""`prism topics create` on the embedded broker: source topics get a short retention (they hold
producer tokens), other topics the broker default; an existing source topic that keeps records
longer is reported with the fix."""

from __future__ import annotations

import asyncio
from pathlib import Path

import yaml
from typer.testing import CliRunner

from app.broker.admin import check_retention, ensure_topics
from app.cli.main import app
from app.topology import load_topology
from tests.worker.conftest import dev_keys, make_topology  # noqa: F401 - fixtures (broker: tests/conftest.py)


def _create(path: Path, bootstrap: str, *extra: str):
    return CliRunner().invoke(app, ["topics", "create", "-t", str(path), *extra],
                              env={"PRISM_BROKER_URL": bootstrap})


async def test_source_topics_get_the_short_retention(broker, tmp_path: Path, dev_keys) -> None:  # noqa: F811
    topo = make_topology(tmp_path, dev_keys, partitions=2)
    src = topo.sources[0].topic
    res = await asyncio.to_thread(_create, tmp_path / "topology.yaml", broker.bootstrap, "--source-retention", "1h")
    assert res.exit_code == 0, res.output
    assert f"created  {src} (2 partitions, retention.ms=3600000)" in res.output
    (c,) = await check_retention(broker.bootstrap, {src: 3_600_000})
    assert (c.status, c.actual_ms) == ("ok", 3_600_000)
    # outputs and the DLQ keep the broker default: they never hold a token
    (out,) = await check_retention(broker.bootstrap, {src + ".v3": 3_600_000})
    assert out.status == "unknown"


async def test_topology_key_is_the_default_and_an_existing_longer_topic_is_reported(
        broker, tmp_path: Path, dev_keys) -> None:  # noqa: F811
    topo = make_topology(tmp_path, dev_keys, partitions=1)
    src = topo.sources[0].topic
    doc = yaml.safe_load((tmp_path / "topology.yaml").read_text())
    doc["sources"][0]["retention"] = "30m"
    (tmp_path / "topology.yaml").write_text(yaml.safe_dump(doc))
    assert load_topology(tmp_path / "topology.yaml").topic_configs() == {src: {"retention.ms": "1800000"}}
    await ensure_topics(broker.bootstrap, {src: 1}, configs={src: {"retention.ms": str(7 * 86_400_000)}})
    res = await asyncio.to_thread(_create, tmp_path / "topology.yaml", broker.bootstrap)
    assert res.exit_code == 0, res.output
    assert f"warning  {src} exists and keeps records retention.ms=604800000, longer than 1800000 ms" in res.output
    assert f"--entity-name {src} --add-config retention.ms=1800000" in res.output


def test_bad_source_retention_is_one_clear_error(tmp_path: Path, dev_keys) -> None:  # noqa: F811
    make_topology(tmp_path, dev_keys)
    for value, what in (("soon", "not a duration"), ("10s", "under one minute"), ("0h", "must be positive")):
        res = _create(tmp_path / "topology.yaml", "127.0.0.1:1", "--source-retention", value)
        assert res.exit_code == 2 and what in res.output and "--source-retention" in res.output, res.output

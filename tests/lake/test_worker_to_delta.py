"""Issue 5 end to end: demo traffic through the worker -> archive tap -> `prism lake compact`
-> a Delta table with one row per distinct emitted message id, read back with delta-rs and
with plain PySpark; a second run adds nothing; a run killed before its commit, re-run, gives
the same table."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable
from rich.console import Console

from app.demo.runner import run_demo
from app.lake.compact import Compactor
from app.lake.maintenance import read_with_spark
from tests.support import require_broker_binary
from tests.worker.conftest import make_topology


class Crash(Exception):
    pass


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, spark):  # `spark` (session fixture) keeps one Spark for the folder
    from app.security.devkeys import ensure_dev_keys

    require_broker_binary()
    tmp = tmp_path_factory.mktemp("worker-to-delta")
    keys = ensure_dev_keys(tmp / "keys")
    topo = make_topology(tmp, keys, partitions=2)
    report = __import__("asyncio").run(run_demo(topo, messages=600, rate=0, data_dir=tmp / "demo",
                                                keys_dir=keys.folder, console=Console(quiet=True), seed=5,
                                                lake=True))
    return report, tmp / "demo"


def _ids(table: str) -> list[str]:
    return DeltaTable(table).to_pyarrow_table(columns=["message_id"]).column("message_id").to_pylist()


def test_table_has_one_row_per_emitted_message(demo_run, spark) -> None:
    report, _ = demo_run
    assert report.ok, report.mismatches[:5]
    table = report.lake["table"]
    ids = _ids(table)
    assert len(ids) == len(set(ids)) == report.worker["emitted"]
    assert set(ids) == report.emitted_ids  # exactly what the worker wrote to .v3
    spark_ids = {r.message_id for r in read_with_spark(spark, table).select("message_id").collect()}
    assert spark_ids == set(ids)
    row = DeltaTable(table).to_pyarrow_table(columns=["signature_key_id", "namespace"]).to_pylist()[0]
    assert row["signature_key_id"] == "prism-worker-1" and row["namespace"] == "order-events"


def test_second_run_adds_nothing(demo_run, spark) -> None:
    report, data = demo_run
    table = report.lake["table"]
    before = DeltaTable(table).version()
    summary = Compactor(spark, str(data / "archive"), table).run()
    assert summary.total("rows_written") == 0
    assert DeltaTable(table).version() == before


def test_killed_before_commit_then_rerun_gives_the_same_table(demo_run, spark, tmp_path: Path) -> None:
    report, data = demo_run
    table = str(tmp_path / "crashed")

    def crash(point: str) -> None:
        raise Crash(point)

    with pytest.raises(Crash):
        Compactor(spark, str(data / "archive"), table, fault=crash).run()
    # killed after writing data files, before the commit: nothing is visible
    assert not (Path(table) / "_delta_log").exists()
    assert any(Path(table).rglob("*.parquet")), "the killed run did write its data files"
    Compactor(spark, str(data / "archive"), table).run()
    assert sorted(_ids(table)) == sorted(_ids(report.lake["table"]))

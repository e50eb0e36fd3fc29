"""The lake job on a real Spark cluster: a standalone master and worker started from pyspark's
own launcher (`bin/spark-class`; the pip package ships no `sbin/start-master.sh`), the documented
`spark-submit app/lake/compact.py ...` against `spark://`, and the Delta table it writes equal,
row for row, to a local-mode run's on the same archive.

Only loopback addresses; small executors (512m, one core); teardown stops exactly the master
and worker processes this test started."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from deltalake import DeltaTable

from app.lake.archive import ArchiveSink
from app.lake.compact import Compactor
from tests.lake.conftest import make_traffic
from tests.support import require

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]


def _spark_bin() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spark_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_GATEWAY", "SPARK_"))}
    env.update(SPARK_LOCAL_IP="127.0.0.1", SPARK_LOCAL_DIRS=str(tmp / "local"), SPARK_LOG_DIR=str(tmp / "logs"),
               SPARK_DAEMON_MEMORY="256m", PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    return env


@dataclass
class Cluster:
    url: str        # spark://127.0.0.1:PORT
    ui: str         # the master's web UI (JSON status at /json/)
    env: dict[str, str]


def _status(ui: str) -> dict:
    with urllib.request.urlopen(f"{ui}/json/", timeout=5) as r:
        return json.loads(r.read())


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the one process we started (spark-class execs the JVM: the PID is the JVM's)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    require(shutil.which("java") is not None, "Java 17+ (apt-get install openjdk-17-jre-headless) for Spark")
    tmp = tmp_path_factory.mktemp("spark-cluster")
    env = _spark_env(tmp)
    port, ui_port, worker_ui = _free_port(), _free_port(), _free_port()
    spark_class = str(_spark_bin() / "spark-class")
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    try:
        master_log = open(tmp / "master.log", "wb")  # noqa: SIM115 - closed in finally
        logs.append(master_log)
        procs.append(subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
             "--webui-port", str(ui_port)], env=env, stdout=master_log, stderr=subprocess.STDOUT, cwd=tmp))
        url, ui = f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui_port}"
        worker_log = open(tmp / "worker.log", "wb")  # noqa: SIM115 - closed in finally
        logs.append(worker_log)
        procs.append(subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
             "--webui-port", str(worker_ui), "--cores", "1", "--memory", "1g", "--work-dir", str(tmp / "work")],
            env=env, stdout=worker_log, stderr=subprocess.STDOUT, cwd=tmp))
        deadline = time.monotonic() + 120
        while True:  # wait for the master to be up AND the worker to have registered
            for p, name in zip(procs, ("master", "worker"), strict=True):
                assert p.poll() is None, f"spark {name} exited:\n" + (tmp / f"{name}.log").read_text()[-3000:]
            try:
                st = _status(ui)
                if st.get("status") == "ALIVE" and st.get("aliveworkers", 0) >= 1:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "spark standalone cluster not up in 120 s:\n" + \
                (tmp / "master.log").read_text()[-2000:] + (tmp / "worker.log").read_text()[-2000:]
            time.sleep(0.5)
        yield Cluster(url, ui, env)
    finally:
        for p in reversed(procs):
            _stop(p)
        for f in logs:
            f.close()


def submit_command(master: str, archive: str, table: str) -> list[str]:
    """The command docs/lakehouse.md gives for a standalone cluster whose workers have the
    project installed (the same Python on every node)."""
    return [str(_spark_bin() / "spark-submit"), "--master", master,
            "--conf", "spark.executor.memory=512m", "--conf", "spark.executor.cores=1",
            "--conf", "spark.cores.max=1", "--conf", "spark.driver.memory=512m", "--conf", "spark.ui.enabled=false",
            "--conf", f"spark.pyspark.python={sys.executable}",
            "app/lake/compact.py", archive, table, "--json"]


def _rows(table: str) -> list[dict]:
    return sorted(DeltaTable(table).to_pyarrow_table().to_pylist(), key=lambda r: r["message_id"])


def test_spark_submit_to_a_standalone_cluster_writes_the_local_table(cluster, spark, tmp_path):
    archive = str(tmp_path / "archive")
    main = make_traffic(120, seed=21)
    with ArchiveSink(archive, writer_id="w1", max_file_bytes=40_000) as sink:
        sink.write(main.records)
    other = make_traffic(20, seed=22, source_topic="prism.archive.eu", dup_every=0)
    with ArchiveSink(archive, writer_id="w2") as sink:
        sink.write(other.records)

    # local-mode reference: the same job on the test session's local Spark (local[2]: every core here)
    local_table = str(tmp_path / "local")
    local = Compactor(spark, archive, local_table).run()
    assert local.exit_code == 0 and local.total("rows_written") == len(main.ids | other.ids)

    cluster_table = str(tmp_path / "cluster")
    cmd = submit_command(cluster.url, archive, cluster_table)
    res = subprocess.run(cmd, cwd=ROOT, env=cluster.env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"spark-submit failed ({res.returncode}):\n{res.stderr[-4000:]}"
    summary = json.loads(res.stdout[res.stdout.index("{"):])
    assert summary["exit_code"] == 0 and summary["writer"] == local.writer
    assert summary["totals"]["rows_written"] == len(main.ids | other.ids)

    # the executors really ran on the cluster's worker (not a silent local fallback)
    apps = _status(cluster.ui)["completedapps"] + _status(cluster.ui)["activeapps"]
    assert any(a["name"] == "prism-lake" for a in apps), apps

    rows = _rows(cluster_table)
    assert len(rows) == len(main.ids | other.ids) and rows == _rows(local_table)
    assert DeltaTable(cluster_table).version() == DeltaTable(local_table).version()


def test_delta_spark_writer_on_the_standalone_cluster(cluster, spark, tmp_path):
    """The native writer on `spark://`: the Delta jars from the verified cache go to the cluster
    with `--jars` (no Ivy resolution at submit), and the table equals the local delta-rs one."""
    from app.lake.delta_jars import DELTA_SESSION_CONF, DeltaJarsUnavailable, resolve

    try:
        jars = resolve()
    except DeltaJarsUnavailable as exc:
        require(False, f"the Delta jars: {exc}")
        raise
    archive = str(tmp_path / "archive")
    traffic = make_traffic(80, seed=23)
    with ArchiveSink(archive, writer_id="w1", max_file_bytes=40_000) as sink:
        sink.write(traffic.records)
    local_table = str(tmp_path / "local-delta-rs")
    assert Compactor(spark, archive, local_table, writer="delta-rs").run().exit_code == 0

    cluster_table = str(tmp_path / "cluster-delta-spark")
    base = submit_command(cluster.url, archive, cluster_table)
    conf = [arg for key, value in DELTA_SESSION_CONF.items() for arg in ("--conf", f"{key}={value}")]
    cmd = [base[0], "--jars", ",".join(jars.jars), *conf, *base[1:], "--writer", "delta-spark"]
    res = subprocess.run(cmd, cwd=ROOT, env=cluster.env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"spark-submit failed ({res.returncode}):\n{res.stderr[-4000:]}"
    summary = json.loads(res.stdout[res.stdout.index("{"):])
    assert summary["writer"] == "delta-spark" and summary["totals"]["rows_written"] == len(traffic.ids)
    assert "writer: delta-spark - --writer delta-spark" in res.stdout  # spark-submit merges Python's stderr into it
    rows = _rows(cluster_table)
    assert len(rows) == len(traffic.ids) and rows == _rows(local_table)
    assert DeltaTable(cluster_table).schema() == DeltaTable(local_table).schema()

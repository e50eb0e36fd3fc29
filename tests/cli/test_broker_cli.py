"""`prism broker start|status|stop`: a local broker that outlives workers, so the DLQ workflow
("fix, restart the worker, replay") keeps its DLQ, and `prism dlq` finds the broker by itself.

Everything runs through the real CLI in subprocesses, as an operator runs it: the broker must
survive the `prism broker start` process that launched it and the worker that used it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from app.broker import local
from app.broker.embedded import find_free_port
from app.envelope import encode, new_envelope
from tests.support import require_broker_binary
from tests.worker.conftest import ROOT, dev_keys, make_topology  # noqa: F401 - dev_keys is a fixture
from tests.worker.test_run_e2e import stop, wait_for


def _env(state: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PRISM_BROKER_URL"}
    env.update(PRISM_BROKER_STATE_DIR=str(state), PYTHONUNBUFFERED="1")
    return env


def prism(state: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.cli.main", *args], capture_output=True, text=True,
                          cwd=ROOT, env=_env(state), timeout=timeout)


def test_dlq_survives_the_worker_and_prism_dlq_finds_the_broker(tmp_path: Path, dev_keys) -> None:  # noqa: F811
    require_broker_binary()
    state, port = tmp_path / "state", find_free_port()
    res = prism(state, "broker", "start", "--port", str(port))
    assert res.returncode == 0 and f"127.0.0.1:{port}" in res.stdout, res.stdout + res.stderr
    try:
        pid = int((state / "broker.pid").read_text())
        st = prism(state, "broker", "status", "--json")
        assert st.returncode == 0 and json.loads(st.stdout)["pid"] == pid, st.stdout

        topo = make_topology(tmp_path, dev_keys, partitions=1)
        topo_file = str(tmp_path / "topology.yaml")
        log = tmp_path / "worker.log"
        with open(log, "ab") as out:
            worker = subprocess.Popen([sys.executable, "-m", "app.cli.main", "run", "-t", topo_file, "--data-dir",
                                       str(tmp_path / "data")], cwd=ROOT, env=_env(state), stdout=out,
                                      stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: "prism worker ready" in log.read_text(errors="replace"), 180, "worker ready", worker, log)
            text = log.read_text(errors="replace")
            assert f"using the local broker on 127.0.0.1:{port}" in text, text[-3000:]
            assert f"broker 127.0.0.1:{port}" in text and "AlreadyConfiguredWarning" not in text, text[-3000:]
            from confluent_kafka import Producer

            producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}"})
            src = topo.sources[0].topic
            expired = dev_keys.mint_token("late", ttl_s=-5, now=time.time() - 600)
            for i in range(3):
                env = new_envelope(src, {"bad": i}, namespace="order-events")
                env.ensure_security().auth_token = expired
                producer.produce(src, encode(env))
            producer.flush(30)

            def dlq_rows() -> list[dict[str, object]] | None:
                r = prism(state, "dlq", "list", "-t", topo_file, "--json")
                rows = json.loads(r.stdout) if r.returncode == 0 else []
                return rows if len(rows) == 3 else None

            wait_for(dlq_rows, 120, "3 records in the DLQ", worker, log)
        finally:
            assert stop(worker) == 0, log.read_text(errors="replace")[-3000:]
        # the worker is gone; the broker, and the DLQ in it, are not
        assert local.find_running(state) is not None
        listed = prism(state, "dlq", "list", "-t", topo_file, "--json")
        assert listed.returncode == 0, listed.stderr
        rows = json.loads(listed.stdout)  # stdout is the JSON alone; the broker line went to stderr
        assert len(rows) == 3 and {r["reason"] for r in rows} == {"token_expired"}, rows
        assert f"using the local broker on 127.0.0.1:{port}" in listed.stderr
    finally:
        res = prism(state, "broker", "stop")
    assert res.returncode == 0 and "stopped" in res.stdout, res.stdout + res.stderr
    assert not (state / "broker.pid").exists()
    st = prism(state, "broker", "status")
    assert st.returncode == 3 and "not running" in st.stdout
    dlq = prism(state, "dlq", "list", "-t", topo_file)
    assert dlq.returncode == 2 and "prism broker start" in dlq.stderr and "PRISM_BROKER_URL" in dlq.stderr


def test_a_stale_record_is_reported_and_replaced(tmp_path: Path) -> None:
    require_broker_binary()
    state = tmp_path / "state"
    state.mkdir()
    dead = subprocess.Popen(["sleep", "0"])
    dead.wait()  # a pid that existed and is gone
    (state / "broker.pid").write_text(f"{dead.pid}\n")
    (state / "broker.port").write_text("1\n")
    st = prism(state, "broker", "status")
    assert st.returncode == 3 and "stale" in st.stdout and str(dead.pid) in st.stdout, st.stdout
    (state / "broker.pid").write_text(f"{os.getpid()}\n")  # alive, but not a broker (a reused pid)
    assert local.probe(state) == (None, local.read_record(state))
    port = find_free_port()
    res = prism(state, "broker", "start", "--port", str(port))
    try:
        assert res.returncode == 0 and "started" in res.stdout, res.stdout + res.stderr
        again = prism(state, "broker", "start", "--port", str(port))
        assert again.returncode == 0 and "already running" in again.stdout
        other = prism(state, "broker", "start", "--port", str(find_free_port()))
        assert other.returncode == 2 and "error [broker_running]" in other.stderr
    finally:
        prism(state, "broker", "stop")
    # a broker killed behind our back leaves a stale record that `stop` cleans up
    res = prism(state, "broker", "start", "--port", str(port))
    pid = int((state / "broker.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: local.find_running(state) is None, 10, "the killed broker gone")
    res = prism(state, "broker", "stop")
    assert res.returncode == 0 and "stale record" in res.stdout and not (state / "broker.pid").exists(), res.stdout


def test_a_port_in_use_is_one_clear_error(tmp_path: Path) -> None:
    require_broker_binary()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        res = prism(tmp_path / "state", "broker", "start", "--port", str(taken))
    assert res.returncode == 2 and "Traceback" not in res.stdout + res.stderr, res.stderr
    assert f"error [broker_port_in_use] cannot start the local broker: 127.0.0.1:{taken} is already in use" in res.stderr
    assert "; fix: " in res.stderr and not (tmp_path / "state" / "broker.pid").exists()


def test_status_group_finds_the_local_broker_as_dlq_list_does(tmp_path: Path) -> None:
    """docs/operations.md: `prism status --group` connects "as `prism dlq list` does" - which, without
    PRISM_BROKER_URL, is the running local broker. It said "no broker configured" instead."""
    require_broker_binary()
    state, port = tmp_path / "state", find_free_port()
    group = f"g-{os.getpid()}-{port}"
    assert prism(state, "broker", "start", "--port", str(port)).returncode == 0
    try:
        res = prism(state, "status", "--group", group, "--json")
        assert res.returncode == 0, res.stdout + res.stderr
        assert json.loads(res.stdout)["group"] == group  # stdout is the JSON alone
        assert f"using the local broker on 127.0.0.1:{port}" in res.stderr, res.stderr
    finally:
        assert prism(state, "broker", "stop").returncode == 0
    gone = prism(state, "status", "--group", group)
    assert gone.returncode == 2 and gone.stderr.startswith("error [") and "prism broker start" in gone.stderr

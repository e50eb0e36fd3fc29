"""`prism run` as operators start it (a subprocess, the embedded broker by default): the worker
runs on uvloop, and says so in its ready file and on `/readyz`; SIGTERM stops it with exit 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from app.broker.embedded import find_free_port, with_parent_death_signal
from app.worker.faust_app import READY_FILE_ENV
from tests.worker.conftest import ROOT, make_topology


def wait_for(cond: Any, timeout: float, what: str, proc: subprocess.Popen[bytes] | None = None,
             log: Path | None = None) -> Any:
    """Poll `cond()` until it returns something truthy; fail with `what` (and the log tail)."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: the process exited with {proc.returncode}; log tail:\n"
                                 f"{log.read_text(errors='replace')[-4000:] if log else ''}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g}s; log tail:\n"
                                 f"{log.read_text(errors='replace')[-4000:] if log else ''}")
        time.sleep(0.2)


def start_prism_run(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    cmd = with_parent_death_signal([sys.executable, "-m", "app.cli.main", "run", *args])
    full_env = {k: v for k, v in os.environ.items() if k != "PRISM_BROKER_URL"}
    full_env.update(env)
    full_env["PYTHONUNBUFFERED"] = "1"
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen[bytes], timeout: float = 90) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def get_json(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_prism_run_uses_uvloop(tmp_path: Path, dev_keys) -> None:
    make_topology(tmp_path, dev_keys, partitions=2, archive={"enabled": True, "path": str(tmp_path / "archive")})
    port = find_free_port()
    ready, log = tmp_path / "ready.json", tmp_path / "run.log"
    proc = start_prism_run(["--topology", str(tmp_path / "topology.yaml"), "--data-dir", str(tmp_path / "data"),
                            "--no-dev-keys", "--web-port", str(port)], log, {READY_FILE_ENV: str(ready)})
    try:
        wait_for(ready.exists, 180, "prism run ready file", proc, log)
        info = json.loads(ready.read_text())
        assert info["event_loop"] == "uvloop", info
        _status, doc = wait_for(lambda: _readyz(port), 60, "/readyz answering", proc, log)
        assert doc["event_loop"] == "uvloop" and doc["pid"] == info["pid"], doc
        # the compiled hot path's state (app/native.py), the same in both, and in the ready log line
        assert doc["native"] == info["native"] and isinstance(info["native"]["active"], bool), doc
        assert "hot path " in log.read_text(errors="replace")
    finally:
        code = stop(proc)
    assert code == 0, log.read_text(errors="replace")[-4000:]


def _readyz(port: int) -> tuple[int, dict[str, Any]] | None:
    try:
        return get_json(f"http://127.0.0.1:{port}/readyz")
    except OSError:
        return None


def test_prism_run_processes_supervises_restarts_and_stops(tmp_path: Path, dev_keys) -> None:
    """`prism run --processes 2` on the embedded default: one broker, two uvloop workers in one
    group with their own data dirs and writer ids; a kill -9'd worker is restarted and reported;
    SIGTERM stops everything with exit 0."""
    topo = make_topology(tmp_path, dev_keys, partitions=4,
                         archive={"enabled": True, "path": str(tmp_path / "archive")})
    port = find_free_port()
    data, log = tmp_path / "data", tmp_path / "supervisor.log"
    status_file = data / topo.name / "supervisor.json"
    proc = start_prism_run(["--topology", str(tmp_path / "topology.yaml"), "--data-dir", str(data),
                            "--no-dev-keys", "--web-port", str(port), "--processes", "2"], log, {})

    def status() -> dict[str, Any] | None:
        try:
            return json.loads(status_file.read_text())
        except (OSError, ValueError):
            return None

    try:
        first = wait_for(lambda: (s := status()) and s["ready"] and s, 240, "both workers ready", proc, log)
        children = first["children"]
        assert [c["state"] for c in children] == ["ready", "ready"]
        assert {c["event_loop"] for c in children} == {"uvloop"}
        assert len({c["pid"] for c in children}) == 2 and proc.pid not in {c["pid"] for c in children}
        assert [Path(c["data_dir"]).name for c in children] == ["proc-0", "proc-1"]
        assert len({c["writer_id"] for c in children}) == 2
        code, doc = get_json(f"http://127.0.0.1:{port}/readyz")
        assert code == 200 and doc["ready"], doc
        victim = children[1]["pid"]
        os.kill(victim, signal.SIGKILL)
        again = wait_for(lambda: (s := status()) and s["children"][1]["restarts"] == 1 and s["ready"] and s,
                         240, "the killed worker restarted and ready", proc, log)
        assert again["children"][1]["last_exit"] == -signal.SIGKILL
        assert again["children"][1]["pid"] not in (None, victim)
        assert again["children"][0]["restarts"] == 0 and again["children"][0]["pid"] == children[0]["pid"]
        res = subprocess.run([sys.executable, "-m", "app.cli.main", "status", "--url", f"http://127.0.0.1:{port}",
                              "--json", "--interval", "0.2"], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        st = json.loads(res.stdout)
        assert st["supervisor"]["restarts"] == 1 and len(st["workers"]) == 2
        assert all("status" in w for w in st["workers"]), st["workers"]
    finally:
        code = stop(proc, timeout=120)
    assert code == 0, log.read_text(errors="replace")[-4000:]
    final = status()
    assert final is not None and [c["state"] for c in final["children"]] == ["stopped", "stopped"]
    assert all(c["last_exit"] == 0 for c in final["children"]), final
    for i in (0, 1):  # no worker crashed (the kill -9 aside): no traceback, no ConsistencyError
        text = (data / topo.name / f"proc-{i}" / "worker.log").read_text(errors="replace")
        assert "ConsistencyError" not in text, text[-3000:]


def test_prism_demo_runs_the_worker_on_uvloop(tmp_path: Path) -> None:
    # the shipped topology: the demo's load generator signs with var/dev-keys, which it names
    out = tmp_path / "report.json"
    res = subprocess.run([sys.executable, "-m", "app.cli.main", "demo", "-n", "200", "--no-lake", "--data-dir", str(tmp_path / "demo"), "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={k: v for k, v in os.environ.items() if k != "PRISM_BROKER_URL"})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert json.loads(out.read_text())["worker"]["event_loop"] == "uvloop"

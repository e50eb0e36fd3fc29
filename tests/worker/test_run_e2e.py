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
    finally:
        code = stop(proc)
    assert code == 0, log.read_text(errors="replace")[-4000:]


def _readyz(port: int) -> tuple[int, dict[str, Any]] | None:
    try:
        return get_json(f"http://127.0.0.1:{port}/readyz")
    except OSError:
        return None

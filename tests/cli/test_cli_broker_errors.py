"""Every command that talks to the broker fails like `prism run` does: one line
`error [code] what (at where); fix: how`, exit code 2 - never a traceback - and read-only
commands leave nothing behind.

What this guards: with an unreachable broker `prism dlq list|show|replay`, `prism status --group`
and `prism migrate status` printed 64-69-line aiokafka tracebacks; `--web-port 99999` an 80-line
Faust traceback, and a busy web port a 62-line `OSError` only after the worker had created its
topics; `prism dlq list` on a topology whose topics are missing created its DLQ topic, and
`prism dlq replay` with nothing to replay created the `.replayed` ledger topic. (A wrong SASL
password, told apart from an unreachable broker: tests/kafka/test_worker_security.py.)"""

from __future__ import annotations

import asyncio
import re
import socket
from pathlib import Path
from typing import Any

import pytest

from app.cli.dlq import ledger_topic, topic_exists
from tests.cli.test_dlq_cli import prism
from tests.worker.conftest import dev_keys, make_topology  # noqa: F401 - fixtures (broker: tests/conftest.py)

ONE_LINE = re.compile(r"^error \[(?P<code>[a-z_]+)\] .+; fix: .+$")


def one_error_line(res: Any, code: str) -> str:
    """The whole output is one error line with `code` (stdout and stderr together), exit 2."""
    lines = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.strip()]
    assert res.returncode == 2, res.stdout + res.stderr
    assert len(lines) == 1, res.stdout + res.stderr
    m = ONE_LINE.match(lines[0])
    assert m and m.group("code") == code, lines[0]
    return lines[0]


@pytest.mark.parametrize("args", [("dlq", "list"), ("dlq", "show", "0@1"), ("dlq", "replay"),
                                  ("dlq", "replay", "--dry-run"), ("status", "--group", "g1"),
                                  ("migrate", "status"), ("topics", "create")])
def test_an_unreachable_broker_is_one_line(args: tuple[str, ...]) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = prism(*args, env={"PRISM_BROKER_URL": f"127.0.0.1:{port}"})
    line = one_error_line(res, "kafka_unreachable")
    assert f"127.0.0.1:{port}" in line and "connection refused" in line and "PRISM_BROKER_URL" in line


def test_a_web_port_that_is_no_port_is_refused_before_anything_starts(tmp_path: Path, dev_keys) -> None:  # noqa: F811
    make_topology(tmp_path, dev_keys, partitions=1)
    res = prism("run", "-t", str(tmp_path / "topology.yaml"), "--web-port", "99999", "--data-dir",
                str(tmp_path / "d"), env={"PRISM_BROKER_URL": "127.0.0.1:1"})
    assert "--web-port 99999 is not a TCP port" in one_error_line(res, "bad_config")
    assert not (tmp_path / "d").exists()


async def test_a_busy_web_port_is_refused_before_any_topic_exists(broker, tmp_path: Path, dev_keys) -> None:  # noqa: F811
    topo = make_topology(tmp_path, dev_keys, partitions=1)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = await asyncio.to_thread(prism, "run", "-t", str(tmp_path / "topology.yaml"), "--web-port", str(port),
                                      "--data-dir", str(tmp_path / "d"), env={"PRISM_BROKER_URL": broker.bootstrap})
    assert f"port {port} on 127.0.0.1 is in use" in one_error_line(res, "bad_config")
    assert not await topic_exists(broker.bootstrap, topo.sources[0].topic)  # nothing created
    assert not (tmp_path / "d").exists()


async def test_read_only_commands_create_nothing(broker, tmp_path: Path, dev_keys) -> None:  # noqa: F811
    topo = make_topology(tmp_path, dev_keys, partitions=2)  # its topics were never created
    src = topo.sources[0].topic
    t = str(tmp_path / "topology.yaml")
    for args in (("dlq", "list"), ("dlq", "replay"), ("dlq", "replay", "--dry-run")):
        res = await asyncio.to_thread(prism, *args, "-t", t, env={"PRISM_BROKER_URL": broker.bootstrap})
        assert res.returncode == 0, res.stdout + res.stderr
        assert "Traceback" not in res.stdout + res.stderr
    listed = await asyncio.to_thread(prism, "dlq", "list", "-t", t, "--json", env={"PRISM_BROKER_URL": broker.bootstrap})
    assert listed.stdout.strip() == "[]"
    for topic in (src, src + ".dlq", ledger_topic(src + ".dlq")):
        assert not await topic_exists(broker.bootstrap, topic), topic


def test_prism_audit_with_an_unreachable_backend_is_one_line(tmp_path: Path) -> None:
    import base64
    import os

    ring = tmp_path / "readers.yaml"
    ring.write_text("keys:\n  - id: k1\n    algorithm: hmac-sha256\n    secret_b64: "
                    f"{base64.b64encode(os.urandom(32)).decode()}\n    publisher_id: svc-a\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = prism("audit", "--keyring", str(ring), "--url", f"kafka://127.0.0.1:{port}")
    assert "cannot read the audit topic 'prism.audit'" in one_error_line(res, "broker_error")


@pytest.mark.parametrize("command", [("console",), ("schema", "serve")])
def test_a_server_given_a_bad_or_busy_port_says_so_in_one_line_and_exits(command: tuple[str, ...],
                                                                         tmp_path: Path) -> None:
    """`prism console` and `prism schema serve` given port 99999, port 0 or a port in use printed
    their "listening on" line and then hung in uvicorn's event loop - up to a supervisor, serving
    nothing. Now one line, exit 2, before anything listens (and within the helper's timeout)."""
    from tests.support import write_users_file

    users = write_users_file(tmp_path / "users.yaml")
    base = (*command, "--users-file", str(users))
    env = {"PRISM_REGISTRY_DB": f"sqlite:///{tmp_path / 'registry.db'}"}
    assert "--port 99999 is not a TCP port" in one_error_line(prism(*base, "--port", "99999", env=env), "bad_config")
    assert "--port 0 is not a TCP port" in one_error_line(prism(*base, "--port", "0", env=env), "bad_config")
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = one_error_line(prism(*base, "--port", str(port), env=env), "bad_config")
    assert f"port {port} on 127.0.0.1 is in use" in line and "ss -ltnp" in line
    line = one_error_line(prism(*base, "--host", "10.255.255.1", "--port", "8099", env=env), "bad_config")
    assert "not available" in line and "--host" in line


def test_a_bootstrap_with_a_space_is_one_settings_error_line() -> None:
    """`PRISM_BROKER_URL='no such:1'` was split into `no:9092,such:1` and reported as an
    unreachable `no:9092`; now it is refused as written, before any connection."""
    res = prism("dlq", "list", env={"PRISM_BROKER_URL": "no such:1"})
    line = one_error_line(res, "bad_broker_settings")
    assert "'no such:1' contains whitespace" in line and "no:9092" not in line

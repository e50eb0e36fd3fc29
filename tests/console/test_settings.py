"""The console's back-end URLs (app/console/settings.py), checked when it starts."""

from __future__ import annotations

import pytest

from app.console.settings import split_urls
from app.errors import ConfigError


@pytest.mark.parametrize(("value", "fragment"), [
    ("http://[::1", "is not a usable URL: Invalid IPv6 URL"),
    ("http://h:abc", "is not a usable URL: Port could not be cast"),
    ("http://h:70000", "is not a usable URL: Port out of range"),
    ("http://no such", "holds a space or a control character"),
    ("http://h\x00:80", "holds a space or a control character"),
    ("ftp://h", "is not an http(s) URL"),
])
def test_a_url_no_page_could_use_stops_the_start(value: str, fragment: str) -> None:
    """`prism console --registry 'http://[::1'` was a ValueError traceback; `http://no such`
    started a console whose every page then failed."""
    with pytest.raises(ConfigError) as info:
        split_urls([f"http://127.0.0.1:6066,{value}"], "--worker")
    assert fragment in info.value.message and info.value.path == "--worker" and info.value.hint


def test_good_urls_are_kept_in_order_once() -> None:
    assert split_urls(["http://a:1/, https://[::1]:2", "http://a:1"], "--worker") == ["http://a:1", "https://[::1]:2"]


def test_every_bad_setting_is_reported_at_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A bad worker URL hid a bad CA file and a bad audit keyring until the next start."""
    from app.console.settings import ConsoleSettings
    from app.errors import ConfigProblems

    a_dir = tmp_path / "d"
    a_dir.mkdir()
    env = {"PRISM_ADMIN_CAFILE": str(tmp_path / "none.pem"), "PRISM_CONSOLE_AUDIT_KEYRING": str(a_dir),
           "PRISM_CONSOLE_AUDIT_KEY": "k"}
    with pytest.raises(ConfigProblems) as err:
        ConsoleSettings.from_env(None, worker_urls=["not-a-url"], env=env)  # type: ignore[arg-type]
    assert [p.path for p in err.value.problems] == ["--worker", "PRISM_ADMIN_CAFILE", str(a_dir)], err.value.problems


def test_the_console_command_reports_every_problem_at_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`prism console` stopped at its first problem (no users file); now one line each, then how
    many."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as s:  # a free port, released
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PRISM_")},
           "PRISM_CONSOLE_WORKER_URLS": "not-a-url", "PRISM_ADMIN_CAFILE": str(tmp_path / "none.pem")}
    res = subprocess.run([sys.executable, "-m", "app.cli.main", "console", "--port", str(port), "--ssl-certfile", "x"],
                         capture_output=True, text=True, timeout=120, env=env,
                         cwd=Path(__file__).resolve().parents[2])
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert [ln.split(" (at ")[1].split(")")[0] for ln in lines[:-1]] == [
        "--users-file", "--ssl-certfile", "--worker", "PRISM_ADMIN_CAFILE"], res.stderr
    assert lines[-1] == "4 configuration problems; nothing was started"

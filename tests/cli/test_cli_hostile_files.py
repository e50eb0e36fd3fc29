"""Every CLI command that reads a file it did not write answers a hostile one with exactly one
`error [code] ... fix:` line, or its report, never a traceback (issue 28: "the same size and depth
cases run against every server and every CLI command"); usage mistakes are one line too.

The files: 200,000 nested JSON arrays, a 3,000-deep Avro schema, a 6,000-deep JSON Schema,
random bytes, 20 MiB (over the envelope limit) and an `#ENVELOPE` header with no `=`. The broker
commands (`prism dlq`, `prism status`, `prism audit`) read the same decoders through
`tests/compliance/test_untrusted_decoders.py` and `tests/cli/test_cli_broker_errors.py`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import serve_http
from tests.worker.conftest import ROOT

HOSTILE = {
    "deep.json": b"[" * 200_000 + b"]" * 200_000,
    "deep.avsc": b'{"type":' * 3_000 + b'"string"' + b"}" * 3_000,
    "deep.schema.json": b'{"properties":{"a":' * 3_000 + b"{}" + b"}}" * 3_000,
    "garbage.bin": bytes(range(256)) * 20,
    "big.bin": b"\x0a" * (20 * 1024 * 1024),
    "lnmp.txt": b"#ENVELOPE " + b"x" * 100_000,
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("hostile")
    for name, data in HOSTILE.items():
        (d / name).write_bytes(data)
    return d


def _prism(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.cli.main", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})


def _one_error_line(res: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.strip()]
    assert "Traceback" not in res.stderr and len(lines) == 1, res.stdout[-2000:] + res.stderr[-2000:]
    assert lines[0].startswith("error [") and "fix:" in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("name", ["deep.json", "garbage.bin", "big.bin", "lnmp.txt", "/dev/zero"])
@pytest.mark.parametrize("command", [("envelope", "inspect"), ("envelope", "validate"),
                                     ("envelope", "convert", "--to", "reviewed", "-o", "out.bin")])
def test_envelope_commands_on_hostile_files(files: Path, command: tuple[str, ...], name: str) -> None:
    res = _prism(*command[:2], name, *command[2:], cwd=files)
    assert res.returncode == 2
    _one_error_line(res)


@pytest.mark.parametrize("name", ["deep.avsc", "deep.schema.json", "deep.json"])
def test_schema_validate_on_a_schema_nested_too_deep(files: Path, name: str) -> None:
    res = _prism("schema", "validate", "-f", name, cwd=files)
    assert res.returncode == 1
    assert "nested too deeply" in _one_error_line(res)


def test_schema_audit_names_every_schema_it_cannot_parse(files: Path) -> None:
    res = _prism("schema", "audit", "--dir", ".", cwd=files)
    assert "Traceback" not in res.stderr
    for name in ("deep.avsc", "deep.json", "deep.schema.json"):
        assert f"❌ {name} (unparsable:" in res.stdout and "nested too deeply" in res.stdout


@pytest.mark.parametrize("args", [("envelope", "convert", "x"), ("nosuch",), ("run", "--web-port", "abc"),
                                  ("dlq", "list", "--bogus"),
                                  # numbers no command can use: NaN passed `> 0` checks, inf slept forever
                                  ("demo", "--rate", "nan"), ("status", "--interval", "inf"),
                                  ("envelope", "migrate", "--from", "redis://127.0.0.1:1/s", "--to",
                                   "kafka://127.0.0.1:1", "--topic", "t", "--idle-seconds", "nan"),
                                  ("lake", "compact", "a", "t", "--max-files", "0")])
def test_usage_mistakes_are_one_line(files: Path, args: tuple[str, ...]) -> None:
    res = _prism(*args, cwd=files)
    assert res.returncode == 2
    assert _one_error_line(res).startswith("error [usage] ")


@pytest.mark.parametrize(("args", "commands"), [(("keys",), "init"), (("dlq",), "replay, list, show")])
def test_a_group_without_its_command_says_which_commands_it_has(files: Path, args: tuple[str, ...],
                                                                commands: str) -> None:
    """A bare group prints its help (what the user asked for, in effect) and then the one error
    line, which names what is missing - not an empty `error [usage]  (at ...)`."""
    res = _prism(*args, cwd=files)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    last = [ln for ln in res.stderr.splitlines() if ln.strip()][-1]
    assert last.startswith(f"error [usage] missing command (one of: {commands}) (at "), last
    assert last.endswith(f" {args[0]}); fix: see `{last.split('(at ')[1].split(')')[0]} --help`"), last


@pytest.fixture
def hostile_server():
    """An HTTP server at a Prism address that answers every GET with JSON nested 100,000 deep:
    what a misconfigured or hostile address can send `prism status` and `prism schema` (the
    size bound is tests/test_untrusted_json.py's)."""
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"[" * 100_000 + b"]" * 100_000
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with serve_http(Handler) as url:
        yield url


@pytest.mark.parametrize("args", [("status", "--url", "{url}"), ("schema", "list", "--registry", "{url}"),
                                  ("schema", "get", "--topic", "t", "--registry", "{url}")])
def test_a_hostile_server_is_one_error_line(files: Path, hostile_server: str, args: tuple[str, ...]) -> None:
    """Deeply nested JSON from the address given was a RecursionError traceback."""
    res = _prism(*(a.format(url=hostile_server) for a in args), cwd=files)
    assert res.returncode != 0
    assert "nested too deeply" in _one_error_line(res)


def test_a_file_a_command_cannot_write_is_a_file_error_not_a_broker_one(files: Path) -> None:
    """An OSError naming a file was reported as "the broker connection failed" with a fix about
    PRISM_BROKER_URL; it is the path the user gave."""
    res = _prism("keys", "init", "--dir", "/proc/no-such-dir/keys", cwd=files)
    assert res.returncode == 2
    line = _one_error_line(res)
    assert line.startswith("error [file_error] cannot use /proc/no-such-dir") and "PRISM_BROKER_URL" not in line


def test_an_error_quoting_user_text_prints_it_as_written(files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """rich turned ":b:" in a quoted value into an emoji: PRISM_BROKER_URL=a:b:c was shown as 'a🅱c'."""
    monkeypatch.setenv("PRISM_BROKER_URL", "a:b:c")
    line = _one_error_line(_prism("dlq", "list", "-t", str(ROOT / "topologies/orders-created.yaml"), cwd=files))
    assert "'a:b:c' has an invalid port 'c'" in line, line

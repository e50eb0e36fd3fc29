"""Bad configuration and bad input through the real CLI: each gives its documented error on
one line (what, where, how to fix) and exit code 2 - never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.envelope import Layout, encode, new_envelope

ROOT = Path(__file__).resolve().parents[2]


def prism(*args: str, env: dict | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "app.cli.main", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=60, env={**os.environ, **(env or {})})


def assert_clean_error(res: subprocess.CompletedProcess, code: str, *fragments: str) -> None:
    out = res.stdout + res.stderr
    assert res.returncode == 2, out
    assert "Traceback" not in out, out
    assert f"[{code}]" in out, out
    for f in fragments:
        assert f in out, out


VALID = (ROOT / "topologies/orders-created.yaml").read_text()


def _line(text: str) -> int:
    """The line of the shipped topology that `text` starts (1-based)."""
    return VALID[:VALID.index(text)].count("\n") + 1


@pytest.mark.parametrize(
    ("mutate", "code", "fragments"),
    [
        (lambda t: t + "\n  bad: [unclosed\n", "bad_config", ["not valid YAML", ":"]),
        (lambda t: t.replace("  - dedup:", "  - dedupe:"), "bad_config", ["unknown stage 'dedupe'", "known stages"]),
        (lambda t: t.replace("partitions: 4", "partitions: 0"), "bad_config",
         ["sources[0].partitions", "greater than or equal to 1"]),
        (lambda t: t.replace("  - normalize: {}\n", ""), "bad_config", ["must start with `normalize`"]),
        (lambda t: t.replace("  - validate:\n      max_future_skew_s: 300\n", "") + "", "bad_config", []),
        (lambda t: t.replace("      policy: optional    # verify tokens", "      policy: sometimes    # verify tokens"),
         "bad_config", ["stages[2].authenticate.policy", "'required', 'optional' or 'off'"]),
        (lambda t: t.replace("layouts: [v2, v3]", "layouts: [v4]"), "bad_config", ["outputs.layouts"]),
        (lambda t: t.replace("namespace: order-events\n", "namespace: order-events\ncolour: blue\n"), "bad_config",
         ["colour: unknown key", ".yaml:13); fix: "]),
        # a typo names the key it meant, and the line it is on
        (lambda t: t.replace("  max_attempts: 3", "  max_attempt: 3"), "bad_config",
         ["dlq.max_attempt: unknown key - did you mean 'max_attempts'?", f".yaml:{_line('  max_attempts: 3')})"]),
        (lambda t: t.replace("      window_s: 3600", "      window_s: true"), "bad_config",
         ["stages[5].dedup.window_s: should be a whole number, not the boolean true", f".yaml:{_line('      window_s: 3600')})"]),
    ],
    ids=["yaml-syntax", "unknown-stage", "zero-partitions", "no-normalize", "still-valid", "bad-enum",
         "bad-layout", "unknown-key", "typo-key", "bool-for-int"],
)
def test_bad_topology_files(tmp_path: Path, mutate, code: str, fragments: list[str]) -> None:
    path = ROOT / "topologies" / f".test-{tmp_path.name}.yaml"
    path.write_text(mutate(VALID))
    try:
        res = prism("topics", "create", "--topology", str(path), env={"PRISM_BROKER_URL": "127.0.0.1:1"})
    finally:
        path.unlink()
    if not fragments:  # a valid topology gets past loading; it then fails on the unreachable broker, cleanly
        out = res.stdout + res.stderr
        assert res.returncode == 2 and "Traceback" not in out and "bad_config" not in out, out
        return
    assert_clean_error(res, code, str(path.name), *fragments)


def test_missing_topology_file() -> None:
    assert_clean_error(prism("topics", "create", "--topology", "nope.yaml", env={"PRISM_BROKER_URL": "x:1"}),
                       "bad_config", "cannot read topology file", "nope.yaml")


def test_bad_broker_environment() -> None:
    res = prism("topics", "create", env={"PRISM_BROKER_URL": "127.0.0.1:1", "PRISM_SECURITY_PROTOCOL": "TLS-ish"})
    assert_clean_error(res, "bad_broker_settings", "PRISM_SECURITY_PROTOCOL", "SASL_SSL")


def test_missing_key_files_fail_at_startup(tmp_path: Path) -> None:
    from app.security.devkeys import ensure_dev_keys

    jwks = ensure_dev_keys(tmp_path / "keys").jwks_path
    doc = VALID.replace("../var/dev-keys/signing.json", str(tmp_path / "missing-signing.json"))
    path = tmp_path / "t.yaml"
    path.write_text(doc.replace("schemas/order_created.proto", str(ROOT / "topologies/schemas/order_created.proto"))
                    .replace("../var/dev-keys/jwks.json", str(jwks)))
    res = prism("run", "--topology", str(path), "--no-dev-keys", "--data-dir", str(tmp_path / "d"),
                env={"PRISM_BROKER_URL": "127.0.0.1:1"})
    assert_clean_error(res, "no_keys", "verify_signature.keyring", "missing-signing.json", "prism keys init")
    (tmp_path / "missing-signing.json").write_text("{}")  # there, but not a keyring: the contents are checked too
    res = prism("run", "--topology", str(path), "--data-dir", str(tmp_path / "d"),
                env={"PRISM_BROKER_URL": "127.0.0.1:1"})
    assert_clean_error(res, "bad_config", "signing keyring", "missing-signing.json")


@pytest.mark.parametrize("bind", ["not a host", "0.0.0.0; rm -rf /", "-h", "a" * 300, "300.1.1.1"])
def test_a_bad_web_bind_is_refused_before_anything_starts(tmp_path: Path, bind: str) -> None:
    res = prism("run", "--no-dev-keys", f"--web-bind={bind}", "--data-dir", str(tmp_path / "d"),
                env={"PRISM_BROKER_URL": "127.0.0.1:1"})
    assert_clean_error(res, "bad_config", "--web-bind", "0.0.0.0")
    assert not (tmp_path / "d").exists()


def test_web_bind_comes_from_the_environment_too(tmp_path: Path) -> None:
    res = prism("run", "--no-dev-keys", "--data-dir", str(tmp_path / "d"),
                env={"PRISM_BROKER_URL": "127.0.0.1:1", "PRISM_WEB_BIND": "no such host!"})
    assert_clean_error(res, "bad_config", "'no such host!'")


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"\x0a\x05abc", "truncated"),
        (b"", "unknown_layout"),
        (b"\x0a\x03\x0a\x01\xff", "malformed_envelope"),
        (b"\x0b\x00", "wire_type"),
    ],
)
def test_envelope_inspect_bad_input(tmp_path: Path, data: bytes, code: str) -> None:
    f = tmp_path / "bad.bin"
    f.write_bytes(data)
    res = prism("envelope", "inspect", str(f))
    out = res.stdout + res.stderr
    assert res.returncode == 2 and "Traceback" not in out, out
    assert "[" in out and "error" in out, out


def test_envelope_tools_round_trip(tmp_path: Path) -> None:
    env = new_envelope("orders.created", {"order_id": 1}, namespace="order-events", priority=0)
    src = tmp_path / "e.bin"
    src.write_bytes(encode(env, Layout.REVIEWED))
    res = prism("envelope", "inspect", str(src), "--payload")
    assert res.returncode == 0 and '"order_id": 1' in res.stdout and '"layout": "reviewed"' in res.stdout
    assert prism("envelope", "validate", str(src)).returncode == 0
    res = prism("envelope", "convert", str(src), "--to", "draft", "-o", str(tmp_path / "d.bin"))
    assert res.returncode == 0 and "metadata.priority: explicit 0" in res.stdout
    assert prism("envelope", "inspect", str(tmp_path / "d.bin")).stdout.count('"layout": "draft"') == 1
    bad = new_envelope("t", b"x", namespace="n")
    bad.metadata.ClearField("message_id")
    (tmp_path / "bad.bin").write_bytes(encode(bad))
    res = prism("envelope", "validate", str(tmp_path / "bad.bin"))
    assert res.returncode == 1 and "metadata.message_id" in res.stdout


def test_arguments_and_variables_that_are_not_utf8_are_one_usage_line(tmp_path: Path) -> None:
    """A byte that is not UTF-8 in an argument or a PRISM_* variable reaches Python as a lone
    surrogate; wherever a command encoded it first (a socket address, a URL, a table path) it was a
    `UnicodeEncodeError` traceback. It is refused before any command runs, naming which."""
    import os

    base = [sys.executable, "-m", "app.cli.main"]
    env = {k: v for k, v in os.environb.items() if not k.startswith(b"PRISM_")}
    for args, extra, fragment in (
        ([b"lake", b"stats", str(tmp_path).encode() + b"/\xff"], {}, "argument 3 ('"),
        ([b"status", b"--group", b"\xfe"], {}, "argument 3 ('\\xfe') is not UTF-8 text"),
        ([b"dlq", b"list"], {b"PRISM_BROKER_URL": b"\xff:9092"},
         "environment variable PRISM_BROKER_URL ('\\xff:9092') is not UTF-8 text (at PRISM_BROKER_URL)"),
    ):
        res = subprocess.run(base + args, capture_output=True, cwd=ROOT, timeout=60, env={**env, **extra})
        err = res.stderr.decode()
        assert res.returncode == 2 and "Traceback" not in err, err
        assert err.count("\n") == 1 and err.startswith("error [usage] ") and fragment in err and "; fix: " in err, err


def test_an_aborted_prompt_is_one_error_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """Ctrl-D at a prompt (or a closed stdin) made typer print "Aborted." - not the error line a
    script greps for. `main` installs the one-line form for it with the usage errors'."""
    import click
    import typer.rich_utils

    from app.cli.main import _one_line_usage_errors

    for owner, name in ((typer.rich_utils, "rich_abort_error"), (typer.rich_utils, "rich_format_error"),
                        (click.ClickException, "show")):
        monkeypatch.setattr(owner, name, getattr(owner, name))  # restored after the test
    _one_line_usage_errors()
    typer.rich_utils.rich_abort_error()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error [aborted] ") and "; fix: " in err, err


def test_demo_checks_its_report_file_before_it_starts(tmp_path: Path) -> None:
    """`prism demo --json DIR` ran the whole demo - broker, worker, every message - and then failed
    to write its report. The file is checked first; nothing is started."""
    data = tmp_path / "demo-data"
    for target, fragment in ((tmp_path, "is a directory"), (tmp_path / "none" / "r.json", "no such directory")):
        res = prism("demo", "--json", str(target), "-n", "1", "--no-lake", "--data-dir", str(data))
        assert_clean_error(res, "bad_config", fragment, "(at --json)")
        assert (res.stdout + res.stderr).count("\n") == 1 and not data.exists(), res.stdout + res.stderr


def test_bad_worker_variables_name_the_variable_and_the_value_meant() -> None:
    """PRISM_PROCESSING_GUARANTEE=exactly-once was reported at `--processing-guarantee` (an option
    the operator never passed), and a reserved PRISM_METRIC_LABELS key at `metrics.label_allowlist`
    (a key no file has); both at once now, each at its variable, the guarantee with the word meant."""
    res = prism("run", "--dev-keys", env={"PRISM_BROKER_URL": "127.0.0.1:1", "PRISM_PROCESSING_GUARANTEE": "exactly-once",
                                         "PRISM_METRIC_LABELS": "team,__name__"})
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error [")]
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert any("'exactly-once' is not a processing guarantee - did you mean 'exactly_once'? "
               "(at PRISM_PROCESSING_GUARANTEE)" in ln for ln in lines), res.stderr
    assert any("'__name__'" in ln and "(at PRISM_METRIC_LABELS); fix: " in ln for ln in lines), res.stderr
    assert res.stderr.strip().splitlines()[-1] == "2 configuration problems; nothing was started", res.stderr

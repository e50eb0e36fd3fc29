"""Keys are made on purpose: `prism run` without the keys its topology names refuses to start
and names `prism keys init`, which exists, writes a private key set once and says where it is.

Why: `prism run` used to create development keys silently wherever none were configured - in
containers too - so two workers of one group each signed with their own throwaway key and a
consumer rejected part of the stream."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from app.security.signing import load_signing_keyring
from tests.cli.test_cli_errors import ROOT, VALID, assert_clean_error, prism


def _topology(tmp_path: Path, keys_dir: Path) -> Path:
    """The shipped topology with its key files in `keys_dir` (which may not exist yet)."""
    doc = yaml.safe_load(VALID)
    for stage in doc["stages"]:
        if "authenticate" in stage:
            stage["authenticate"]["jwks"] = str(keys_dir / "jwks.json")
        if "verify_signature" in stage:
            stage["verify_signature"]["keyring"] = str(keys_dir / "signing.json")
        if "enrich" in stage:
            stage["enrich"]["schema"]["path"] = str(ROOT / "topologies/schemas/order_created.proto")
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_run_without_keys_refuses_and_names_keys_init(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    topo = _topology(tmp_path, keys)
    res = prism("run", "--topology", str(topo), "--data-dir", str(tmp_path / "d"),
                env={"PRISM_BROKER_URL": "127.0.0.1:1"})
    assert_clean_error(res, "no_keys", "authenticate.jwks", "verify_signature.keyring", "prism keys init",
                       f"--dir {keys}", "--dev-keys")
    assert not keys.exists() and not (tmp_path / "d").exists()  # nothing generated, nothing started


def test_keys_init_writes_a_private_set_once_and_run_finds_it(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    topo = _topology(tmp_path, keys)
    res = prism("keys", "init", "--topology", str(topo))  # default --dir: where the topology looks
    assert res.returncode == 0, res.stdout + res.stderr
    assert "reads these files already" in res.stdout and "same" in res.stdout, res.stdout
    for name in ("signing.json", "issuer.pem", "jwks.json"):
        assert f"wrote {keys / name} (0600)" in res.stdout, res.stdout
        assert stat.S_IMODE(os.stat(keys / name).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(keys).st_mode) == 0o700
    ring = load_signing_keyring(keys / "signing.json")
    assert ring.worker_key_id == "prism-worker-1" and "dev-producer-1" in ring.signing
    assert json.loads((keys / "jwks.json").read_text())["keys"][0]["kid"] == "dev-issuer-1"
    before = (keys / "signing.json").read_bytes()

    again = prism("keys", "init", "--topology", str(topo))
    assert_clean_error(again, "keys_exist", "signing.json", "--force")
    assert (keys / "signing.json").read_bytes() == before  # never replaced behind anyone's back
    kept = prism("keys", "init", "--dir", str(keys), "--keep-existing")
    assert kept.returncode == 0 and "kept" in kept.stdout and (keys / "signing.json").read_bytes() == before
    both = prism("keys", "init", "--dir", str(keys), "--keep-existing", "--force")  # docs: [--force | --keep-existing]
    assert_clean_error(both, "bad_config", "--force and --keep-existing contradict each other")
    assert (keys / "signing.json").read_bytes() == before  # not replaced by the contradiction
    forced = prism("keys", "init", "--dir", str(keys), "--force")
    assert forced.returncode == 0 and (keys / "signing.json").read_bytes() != before

    # the keys are there now: `prism run` gets past them (to the unreachable broker, cleanly)
    res = prism("run", "--topology", str(topo), "--data-dir", str(tmp_path / "d"),
                env={"PRISM_BROKER_URL": "127.0.0.1:1"})
    out = res.stdout + res.stderr
    assert res.returncode == 2 and "no_keys" not in out and "Traceback" not in out, out


def test_keys_init_replaces_the_demos_throwaway_keys(tmp_path: Path) -> None:
    """Right after `make demo`, `prism keys init` used to fail with keys_exist (the demo's keys sat
    where the topology looks), and the demo's key folder was 0755."""
    from app.security.devkeys import ensure_dev_keys, is_throwaway

    keys = tmp_path / "keys"
    topo = _topology(tmp_path, keys)
    ensure_dev_keys(keys)  # what `prism demo` and `prism run --dev-keys` do
    assert stat.S_IMODE(os.stat(keys).st_mode) == 0o700 and is_throwaway(keys)
    before = (keys / "signing.json").read_bytes()
    res = prism("keys", "init", "--topology", str(topo))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "replaced the throwaway keys" in res.stdout, res.stdout
    assert (keys / "signing.json").read_bytes() != before and not is_throwaway(keys)
    # made on purpose now: a second init refuses as for any shared set
    assert_clean_error(prism("keys", "init", "--topology", str(topo)), "keys_exist", "--force")
    ensure_dev_keys(keys)  # a later --dev-keys run keeps the real set, and does not mark it throwaway
    assert not is_throwaway(keys)


def test_keys_init_elsewhere_says_which_fields_to_point_at_it(tmp_path: Path) -> None:
    res = prism("keys", "init", "--dir", str(tmp_path / "k"))
    assert res.returncode == 0, res.stderr
    assert f"authenticate.jwks: {tmp_path / 'k' / 'jwks.json'}" in res.stdout
    assert f"verify_signature.keyring: {tmp_path / 'k' / 'signing.json'}" in res.stdout


def test_a_child_worker_never_makes_its_own_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--processes N` children are built by app_from_env: without the keys they fail - they can
    never generate a key set each (the supervisor makes the one set, with --dev-keys only)."""
    from app.errors import ConfigError
    from app.worker.pipeline import app_from_env

    keys = tmp_path / "keys"
    monkeypatch.setenv("PRISM_TOPOLOGY", str(_topology(tmp_path, keys)))
    monkeypatch.setenv("PRISM_BOOTSTRAP", "127.0.0.1:1")
    monkeypatch.setenv("PRISM_DATA_DIR", str(tmp_path / "d"))
    monkeypatch.setenv("PRISM_EMBEDDED", "1")
    with pytest.raises(ConfigError):
        app_from_env()
    assert not keys.exists()


def test_every_startup_problem_is_reported_in_one_run(tmp_path: Path) -> None:
    """A topology without its keys, two bad environment variables, a bad flag and a bad log
    level: all five in one run, one error line each, nothing started."""
    topo = _topology(tmp_path, tmp_path / "keys")
    res = prism("run", "--topology", str(topo), "--data-dir", str(tmp_path / "d"), "--web-bind", "not a host",
                "--loglevel", "loud",
                env={"PRISM_BROKER_URL": "", "PRISM_SECURITY_PROTOCOL": "TLS-ish",
                     "PRISM_ADMIN_ALLOW_ANONYMOUS": "everything"})
    out = res.stdout + res.stderr
    assert res.returncode == 2 and "Traceback" not in out, out
    lines = [line for line in res.stderr.splitlines() if line.startswith("error [")]
    codes = sorted(line.split("]")[0].removeprefix("error [") for line in lines)
    assert codes == ["bad_broker_settings", "bad_config", "bad_config", "bad_config", "no_keys"], out
    for fragment in ("--web-bind", "--loglevel", "PRISM_SECURITY_PROTOCOL", "PRISM_ADMIN_ALLOW_ANONYMOUS",
                     "prism keys init"):
        assert fragment in out, out
    assert "5 configuration problems; nothing was started" in out
    assert not (tmp_path / "d").exists()


def test_the_demo_and_dev_keys_still_need_no_setup(tmp_path: Path) -> None:
    """`--dev-keys` makes the missing keys where the topology expects them, once, and warns."""
    keys = tmp_path / "keys"
    topo = _topology(tmp_path, keys)
    res = prism("run", "--topology", str(topo), "--dev-keys", "--data-dir", str(tmp_path / "d"),
                env={"PRISM_BROKER_URL": "127.0.0.1:1"})
    out = res.stdout + res.stderr
    assert "throwaway development keys" in out and "prism keys" in out, out
    # the key set, marked throwaway (`prism keys init` may replace it later without --force)
    assert sorted(p.name for p in keys.iterdir()) == [".throwaway", "issuer.pem", "jwks.json", "signing.json"]
    assert res.returncode == 2 and "no_keys" not in out and "Traceback" not in out, out  # then the dead broker


def test_make_run_and_the_image_do_not_depend_on_silent_keys() -> None:
    """Every shipped way to start a worker either makes the keys on purpose or asks for them."""
    assert "--dev-keys" in (ROOT / "Makefile").read_text().split("\nrun:", 1)[1].split("\n\n", 1)[0]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    keys_cmd = compose["keys"]["command"]
    assert keys_cmd[:2] == ["keys", "init"] and "--keep-existing" in keys_cmd
    assert compose["prism"]["depends_on"]["keys"] == {"condition": "service_completed_successfully"}
    assert "--dev-keys" not in " ".join(compose["prism"]["command"])


@pytest.mark.parametrize("args", [["keys", "--help"], ["keys", "init", "--help"]])
def test_the_suggested_command_exists(args: list[str]) -> None:
    res = subprocess.run([sys.executable, "-m", "app.cli.main", *args], capture_output=True, text=True, cwd=ROOT,
                         timeout=60)
    assert res.returncode == 0 and "init" in res.stdout

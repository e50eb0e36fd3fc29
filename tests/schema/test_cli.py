"""``prism schema`` CLI against a live registry (and offline on files); exit codes for CI."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from typer.testing import CliRunner

from app.schema.cli import schema_app
from tests.support import creds

runner = CliRunner()
V1 = 'syntax = "proto3";\npackage orders.v1;\nmessage OrderCreated {\n  string order_id = 1;\n  double total = 3;\n}\n'
V2 = V1.replace("double total = 3;", "double total = 3;\n  optional double tax_amount = 4;")
V3 = V2.replace("optional double tax_amount = 4;", "optional double tax_amount = 4;\n  string payment_method = 5;")
PII = 'syntax = "proto3";\nmessage UserProfileUpdated {\n  string user_id = 1;\n  string email = 2;\n  string phone = 3;\n}\n'


def run(*args: str, registry: str | None = None, user: str | None = "admin") -> object:
    """``prism schema ARGS`` with ``user``'s credentials in the environment (None: none)."""
    extra = ["--registry", registry] if registry else []
    cmd = list(args)
    # options belong to the (sub)command: insert --registry after the command path
    depth = 2 if cmd[0] == "policy" else 1
    env = {"PRISM_REGISTRY_USER": None, "PRISM_REGISTRY_PASSWORD": None, "PRISM_REGISTRY_TOKEN": None}
    if user is not None:
        env["PRISM_REGISTRY_USER"], env["PRISM_REGISTRY_PASSWORD"] = creds(user)
    return runner.invoke(schema_app, [*cmd[:depth], *extra, *cmd[depth:]], catch_exceptions=False, env=env)


def test_offline_check_and_validate(tmp_path: Path) -> None:
    (tmp_path / "v2.proto").write_text(V2)
    (tmp_path / "v3.proto").write_text(V3)
    (tmp_path / "v1.proto").write_text(V1)
    ok = run("check", "--old", str(tmp_path / "v1.proto"), "--new", str(tmp_path / "v2.proto"))
    assert ok.exit_code == 0 and "✅ Compatible" in ok.output and "tax_amount" in ok.output
    bad = run("check", "--old", str(tmp_path / "v2.proto"), "--new", str(tmp_path / "v3.proto"))
    assert bad.exit_code == 1 and "payment_method" in bad.output and "REQUIRED_FIELD_ADDED" in bad.output
    val = run("validate", "--file", str(tmp_path / "v3.proto"), "--check-backward", "--against",
              str(tmp_path / "v2.proto"))
    assert val.exit_code == 1 and "NOT backward compatible" in val.output
    (tmp_path / "broken.proto").write_text("syntax = 'proto3'; message {")
    assert run("validate", "--file", str(tmp_path / "broken.proto")).exit_code == 1
    (tmp_path / "pii.proto").write_text(PII)
    enforce = run("validate", "--file", str(tmp_path / "pii.proto"), "--pii-policy", "enforce")
    assert enforce.exit_code == 1 and "Field 'email' contains PII" in enforce.output


def test_registry_workflow(live_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url = live_server.url
    for name, text in (("v1.proto", V1), ("v2.proto", V2), ("v3.proto", V3), ("pii.proto", PII)):
        (tmp_path / name).write_text(text)
    r = run("register", "--file", str(tmp_path / "v1.proto"), "--topic", "orders.created", "--version", "v1",
            "--compatibility", "backward", registry=url)
    assert r.exit_code == 0 and "✅ Schema registered" in r.output, r.output
    r = run("register", "--file", str(tmp_path / "v2.proto"), "--topic", "orders.created", "--version", "v2",
            registry=url)
    assert r.exit_code == 0 and "tax_amount" in r.output
    r = run("register", "--file", str(tmp_path / "v3.proto"), "--topic", "orders.created", registry=url)
    assert r.exit_code == 1 and "Breaking changes detected" in r.output and "payment_method" in r.output
    r = run("list", "--topic", "orders.created", registry=url)
    assert r.exit_code == 0 and "v2" in r.output and "current" in r.output
    r = run("get", "--topic", "orders.created", "--version", "v2", "--output", str(tmp_path / "out"), registry=url)
    assert r.exit_code == 0 and (tmp_path / "out" / "orders.created.v2.proto").read_text() == V2
    # consumer-side CI check: consumer still on v1 reads producer v2
    r = run("check", "--topic", "orders.created", "--consumer-schema", str(tmp_path / "v1.proto"), "--mode",
            "backward", registry=url)
    assert r.exit_code == 0 and "producer schema v2" in r.output
    r = run("policy", "set", "--namespace", "users", "--pii-policy", "enforce", "--approval-required-for", "breaking",
            registry=url)
    assert r.exit_code == 0 and '"pii_policy": "enforce"' in r.output
    r = run("register", "--file", str(tmp_path / "pii.proto"), "--topic", "users.profile", registry=url)
    assert r.exit_code == 1 and "PII policy" in r.output
    live_server.registry.set_policy(actor="t", namespace="users", pii_policy="warn")
    assert run("register", "--file", str(tmp_path / "pii.proto"), "--topic", "users.profile",
               registry=url).exit_code == 0
    r = run("audit", "--check-pii", registry=url)
    assert r.exit_code == 1 and "users.profile.v1: Field 'email' missing @prism.pii tag" in r.output
    assert "✅ orders.created.v2: All PII fields tagged" in r.output
    r = run("approve-request", "--schema-file", str(tmp_path / "v3.proto"), "--topic", "orders.created",
            registry=url, user="writer")
    assert r.exit_code == 0 and "#1" in r.output
    assert live_server.registry.store.approvals(None, None)[0].requested_by == "writer"  # the verified user
    # no credentials, or a role that does not allow it: exit 2 and say what to pass
    r = run("list", registry=url, user=None)
    assert r.exit_code == 2 and "HTTP 401" in r.output and "PRISM_REGISTRY_USER" in r.output
    r = run("policy", "set", "--global", "--compatibility", "none", registry=url, user="reader")
    assert r.exit_code == 2 and "HTTP 403" in r.output and "needed role" in r.output
    r = run("approve", "--id", "1", registry=url, user="writer")
    assert r.exit_code == 2 and "HTTP 403" in r.output
    r = runner.invoke(schema_app, ["--user", "bob", "--password", creds("bob")[1], "approve", "--id", "1",
                                   "--registry", url], catch_exceptions=False, env={"PRISM_REGISTRY_USER": None})
    assert r.exit_code == 0 and "approved by bob" in r.output, r.output


def test_codegen_python_importable(tmp_path: Path) -> None:
    src = tmp_path / "orders_created.proto"
    src.write_text(V2.replace('package orders.v1;', 'package orders.v1;\nimport "prism/annotations.proto";')
                   .replace("string order_id = 1;", 'string order_id = 1 [(prism.index) = "primary"];'))
    out = tmp_path / "gen"
    r = run("codegen", "--file", str(src), "--output", str(out), "--language", "python")
    assert r.exit_code == 0, r.output
    mod_path = out / "orders_created_pb2.py"
    assert mod_path.exists() and (out / "orders_created_pb2.pyi").exists()
    assert (out / "prism" / "annotations_pb2.py").exists()  # imported by the generated module
    spec = importlib.util.spec_from_file_location("orders_created_pb2", mod_path)
    assert spec and spec.loader
    sys.path.insert(0, str(out))
    try:
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        msg = mod.OrderCreated(order_id="o1", total=3.5, tax_amount=0.5)
        assert mod.OrderCreated.FromString(msg.SerializeToString()).tax_amount == 0.5
    finally:
        sys.path.remove(str(out))
        sys.modules.pop("prism.annotations_pb2", None)
        sys.modules.pop("prism", None)
    assert run("codegen", "--file", str(src), "--output", str(out), "--language", "go").exit_code == 2


def test_registry_start_line_says_where_what_and_how_without_secrets() -> None:
    from app.schema.cli import start_line
    from app.security.http_auth import HttpAuth

    line = start_line(host="0.0.0.0", port=8081, tls=True, workers=2,
                      store="postgresql://reg:s3cret@db.internal:5432/registry?schema=prism",
                      auth=HttpAuth(anonymous_roles=["read"]))
    assert line == ("prism registry listening on https://0.0.0.0:8081, store "
                    "postgresql://reg:***@db.internal:5432/registry?schema=prism, auth anonymous=read, 2 worker(s)")
    assert "s3cret" not in line
    assert "store sqlite:///prism-registry.db, auth none" in start_line(
        host="::1", port=1, tls=False, workers=1, store="sqlite:///prism-registry.db", auth=HttpAuth())


def test_prism_schema_serve_prints_its_start_line(tmp_path) -> None:
    """The registry logged nothing at start: now one line says where it listens, on which store,
    with which authentication."""
    import subprocess
    import sys

    from tests.schema.conftest import free_port
    from tests.support import write_users_file

    port = free_port()
    users = write_users_file(tmp_path / "users.yaml")
    proc = subprocess.Popen([sys.executable, "-m", "app.cli.main", "schema", "serve", "--port", str(port),
                             "--store", f"sqlite:///{tmp_path / 'reg.db'}", "--users-file", str(users)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().strip()  # blocks until the line (or EOF if it died)
        assert first == (f"prism registry listening on http://127.0.0.1:{port}, store sqlite:///{tmp_path / 'reg.db'}, "
                         "auth basic, 1 worker(s)"), first
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_schema_files_are_read_bounded_and_as_utf8(tmp_path: Path) -> None:
    """A schema file that is not UTF-8, a directory, or endless (`/dev/zero`) is the one
    `bad_input` line with exit 2: they were a `UnicodeDecodeError` traceback, an
    `IsADirectoryError` traceback (`audit --dir`) and a read until memory ran out (7 GB)."""
    (tmp_path / "latin1.proto").write_bytes(b'syntax = "proto3"; // caf\xe9\nmessage A {}\n')
    (tmp_path / "dir.proto").mkdir()
    for args, fragment in (
        (("validate", "--file", str(tmp_path / "latin1.proto")), "schema file is not UTF-8 text (byte 25)"),
        (("validate", "--file", "/dev/zero", "--format", "json"), "schema file is over 16 MiB"),
        (("validate", "--file", str(tmp_path / "dir.proto")), "Is a directory"),
        (("register", "--file", str(tmp_path / "latin1.proto"), "--topic", "orders.created"), "not UTF-8"),
        (("audit", "--dir", str(tmp_path)), "schema file is not UTF-8 text"),
    ):
        r = run(*args, registry="http://127.0.0.1:9")
        lines = r.output.strip().splitlines()
        assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error [bad_input]"), r.output
        assert fragment in r.output and "; fix: " in r.output, r.output


def test_audit_of_a_directory_that_is_not_there_is_an_error(tmp_path: Path) -> None:
    """`audit --dir` of a typo'd path audited nothing and exited 0: a CI job passed without
    looking at one schema."""
    for target, what in ((tmp_path / "nope", "no such directory"), (tmp_path, "no schema files")):
        r = run("audit", "--dir", str(target))
        assert r.exit_code == 2 and r.output.startswith("error [bad_input]") and what in r.output, r.output
    (tmp_path / "f.proto").write_text(V1)
    r = run("audit", "--dir", str(tmp_path / "f.proto"))
    assert r.exit_code == 2 and "not a directory" in r.output, r.output
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "pii.proto").write_text(PII)
    assert run("audit", "--dir", str(tmp_path)).exit_code == 1  # a real audit still finds untagged PII


def test_hash_password_stdin_is_bounded_and_utf8() -> None:
    """`--stdin < /dev/zero` read one endless line; bytes that are not UTF-8 were a traceback."""
    for data, fragment in ((b"\xff\xfe-not-utf8-at-all\n", "not UTF-8 text (byte 0)"),
                           (b"x" * 100_000, "over 4096 bytes")):
        r = runner.invoke(schema_app, ["hash-password", "--stdin"], input=data)
        assert r.exit_code == 2 and r.output.startswith("error [bad_input]") and fragment in r.output, r.output
    ok = runner.invoke(schema_app, ["hash-password", "--stdin"], input=b"correct horse battery staple\n")
    assert ok.exit_code == 0 and ok.output.startswith("$argon2id$"), ok.output


def test_a_registry_url_that_cannot_be_a_url_is_one_line() -> None:
    """`--registry 'http://no such'` (http.client.InvalidURL) and `http://[::1` (ValueError) were
    tracebacks; an unreachable one already was a line."""
    for url, code in (("http://no such", "bad_registry_url"), ("http://[::1", "bad_registry_url"),
                      ("http://127.0.0.1:9", "registry_unreachable")):
        r = run("list", registry=url)
        assert r.exit_code == 2 and r.output.startswith(f"error [{code}]") and "; fix: " in r.output, r.output

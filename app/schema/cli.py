"""``prism schema ...`` commands (typer sub-app; the main CLI mounts ``schema_app``).

Exit codes follow RFC-030's CI workflows: 0 = ok, 1 = breaking change / rejected /
audit failures, 2 = usage or I/O error. Commands that talk to a registry take
``--registry`` (env ``PRISM_REGISTRY_URL``, default ``http://127.0.0.1:8081``); ``check``,
``validate``, ``audit --dir`` and ``codegen --file`` also work offline on files.

Credentials for the registry: ``prism schema --user U --password P ...`` or ``--token JWT``
(env ``PRISM_REGISTRY_USER`` / ``PRISM_REGISTRY_PASSWORD`` / ``PRISM_REGISTRY_TOKEN``). The
audit log records the authenticated user, so there is no ``--actor``.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from app.cli.output import fail
from app.errors import JsonInputError, PrismError
from app.schema.compat import check as compat_check
from app.schema.model import CompatibilityMode, SchemaError, SchemaFormat
from app.schema.pii import PiiPolicy, audit, check_policy
from app.untrusted_json import loads_untrusted, read_json_response

schema_app = typer.Typer(help="Schema registry: register, discover, check compatibility, govern PII.",
                         no_args_is_help=True)
policy_app = typer.Typer(help="Per-namespace policy (compatibility, PII tags, approvals).", no_args_is_help=True)
schema_app.add_typer(policy_app, name="policy")

RegistryOpt = Annotated[str, typer.Option("--registry", envvar="PRISM_REGISTRY_URL", help="registry base URL")]
DEFAULT_REGISTRY = "http://127.0.0.1:8081"
#: Set by the sub-app callback from --user/--password/--token (or their env vars).
_CREDENTIALS: dict[str, str | None] = {"user": None, "password": None, "token": None}


@schema_app.callback()
def _credentials(
    user: Annotated[str | None, typer.Option("--user", envvar="PRISM_REGISTRY_USER",
                                             help="registry user (HTTP basic)")] = None,
    password: Annotated[str | None, typer.Option("--password", envvar="PRISM_REGISTRY_PASSWORD",
                                                 help="registry password (prefer the env var)")] = None,
    token: Annotated[str | None, typer.Option("--token", envvar="PRISM_REGISTRY_TOKEN",
                                              help="bearer JWT for the registry (wins over --user)")] = None,
) -> None:
    """Schema registry: register, discover, check compatibility, govern PII."""
    _CREDENTIALS.update(user=user, password=password, token=token)


def _fail(code: str, what: str, *, where: str | None = None, fix: str | None = None, exit_code: int = 2) -> NoReturn:
    """Print the one error line every prism command uses, `error [code] what (at where); fix: how`
    (app/cli/output.py), and exit. The registry commands printed their own style before (an icon,
    the text, a `hint:` on a second line), so an operator's grep for `error [` missed them."""
    err = PrismError(what, path=where, hint=fix)
    err.code = code
    fail(err, exit_code)


def _api_fail(e: ApiError, where: str, exit_code: int = 1) -> NoReturn:
    """A registry refusal (an HTTP error answer) as the one error line."""
    body = e.body if isinstance(e.body, dict) else {}
    code = body.get("error_code")
    _fail("registry_refused", f"the registry answered HTTP {e.status}" + (f" ({code})" if code else "")
          + f": {body.get('message', e.body) if body else e.body}", where=where,
          fix="see the message; `prism schema list` shows subjects and versions")


class ApiError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        msg = body.get("message") if isinstance(body, dict) else str(body)
        super().__init__(f"HTTP {status}: {msg}")
        self.status, self.body = status, body


def _api(base: str, method: str, path: str, body: Any = None) -> Any:
    from app.security.http_auth import client_auth_header

    data = json.dumps(body).encode() if body is not None else None
    try:
        req = urllib.request.Request(base.rstrip("/") + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", "Accept": "application/json",
                                              **client_auth_header(**_CREDENTIALS)})
        with urllib.request.urlopen(req, timeout=30) as r:
            return read_json_response(r, what=f"{method} {base}{path}")
    except JsonInputError as e:
        _fail("registry_bad_answer", f"the registry's answer is not usable JSON: {e.message}",
              where=f"{method} {base}{path}", fix="check that --registry (PRISM_REGISTRY_URL) is a Prism schema registry")
    except urllib.error.HTTPError as e:
        raw = e.read(64 * 1024).decode("utf-8", "replace")  # an error body is shown, never walked
        if e.code in (401, 403):
            try:
                msg = loads_untrusted(raw, what="registry error").get("message", raw)
            except (ValueError, AttributeError):
                msg = raw
            _fail("registry_unauthorized" if e.code == 401 else "registry_forbidden",
                  f"the registry refused the request: HTTP {e.code}: {msg}", where=f"{method} {base}{path}",
                  fix="pass credentials with --user/--password or --token (PRISM_REGISTRY_USER / "
                      "PRISM_REGISTRY_PASSWORD / PRISM_REGISTRY_TOKEN)"
                      + (" for a user with the needed role" if e.code == 403 else ""))
        try:
            parsed = loads_untrusted(raw, what="registry error")
        except ValueError:
            parsed = raw
        raise ApiError(e.code, parsed) from None
    except urllib.error.URLError as e:
        _fail("registry_unreachable", f"cannot reach the registry: {e.reason}", where=base,
              fix="start it (`prism schema serve`) or pass --registry URL (PRISM_REGISTRY_URL)")
    except (ValueError, http.client.InvalidURL) as e:  # "Invalid IPv6 URL", a space in the host: before any request
        _fail("bad_registry_url", f"the registry URL is not usable: {e}", where=base,
              fix="pass --registry http://HOST:PORT (PRISM_REGISTRY_URL), e.g. http://127.0.0.1:8081")
    except (http.client.HTTPException, OSError) as e:  # closed mid-answer, a read timeout
        _fail("registry_unreachable", f"the registry connection failed: {type(e).__name__}: {e}", where=base,
              fix="check that --registry (PRISM_REGISTRY_URL) is a running Prism schema registry, then retry")


def _q(s: str) -> str:
    return urllib.parse.quote(s, safe="")


#: The registry refuses a schema over 16 MiB; a file past that is not a schema.
MAX_SCHEMA_FILE_BYTES = 16 * 1024 * 1024


def _read(path: Path) -> str:
    """A schema file's text through the one bounded reader (app/config_files.py): a directory, a
    file that is not UTF-8, or `/dev/zero` is the one `bad_input` line, not a traceback or a read
    until memory runs out."""
    from app.config_files import read_text

    try:
        return read_text(path, what="schema file", error=PrismError, max_bytes=MAX_SCHEMA_FILE_BYTES,
                         size_hint="a schema is far smaller; check that the path names the schema file")
    except PrismError as e:
        _fail("bad_input", e.message, where=e.path, fix=e.hint)


def _fmt(path: Path, fmt: str | None) -> SchemaFormat:
    try:
        return SchemaFormat.parse(fmt) if fmt else SchemaFormat.from_filename(path.name)
    except ValueError as e:
        _fail("bad_format", str(e), where="--format" if fmt else str(path),
              fix="pass --format protobuf|avro|json, or name the file .proto, .avsc or .json")


def _mode(mode: str) -> CompatibilityMode:
    alias = {"strict": "FULL", "check_backward": "BACKWARD"}
    try:
        return CompatibilityMode.parse(alias.get(mode.lower(), mode))
    except ValueError as e:
        _fail("bad_mode", str(e), where="--mode", fix="use backward, forward, full, their *_transitive forms or none")


def _print_findings(findings: list[dict[str, Any]] | list[Any]) -> None:
    for f in findings:
        d = f if isinstance(f, dict) else f.to_dict()
        icon = "❌" if d["severity"] == "breaking" else "⚠️ "
        typer.echo(f"   {icon} {d['path']}: {d['reason']} [{d['rule']}]")
        if d.get("hint"):
            typer.echo(f"      ℹ️  {d['hint']}")


@schema_app.command()
def register(
    file: Annotated[Path, typer.Option("--file", "-f", help="schema file (.proto, .avsc, .json)")],
    topic: Annotated[str, typer.Option("--topic", "--subject", help="subject / topic name")],
    version: Annotated[str | None, typer.Option(help="version label, e.g. v2")] = None,
    namespace: Annotated[str | None, typer.Option(help="namespace (default: topic prefix)")] = None,
    compatibility: Annotated[str | None, typer.Option(help="set the subject's compatibility mode first")] = None,
    owner_team: Annotated[str | None, typer.Option("--owner-team")] = None,
    fmt: Annotated[str | None, typer.Option("--format")] = None,
    registry: RegistryOpt = DEFAULT_REGISTRY,
) -> None:
    """Register a schema version. Exit 1 when the registry rejects it (incompatible, PII policy)."""
    text = _read(file)
    meta: dict[str, Any] = {}
    if owner_team:
        meta["owner_team"] = owner_team
    if compatibility:
        meta["compatibility_mode"] = _mode(compatibility).value
    try:
        r = _api(registry, "POST", "/v1/schemas", {"topic": topic, "schema": text, "format": _fmt(file, fmt).value,
                                                   "version": version, "namespace": namespace, "metadata": meta})
    except ApiError as e:
        body = e.body if isinstance(e.body, dict) else {}
        if e.status not in (409, 422) or (e.status == 422 and not body.get("findings")):
            _api_fail(e, f"--topic {topic}")  # an error, not a compatibility or PII verdict
        if e.status == 409:
            typer.echo("❌ Registration blocked: Breaking changes detected")
        elif any(f.get("rule") == "PII_TAG_MISSING" for f in body.get("findings", [])):
            typer.echo("❌ Registration blocked by PII policy: a PII tag is required on every field "
                       "(require_pii_tags)")
        else:
            typer.echo("❌ Registration blocked by PII policy")
        _print_findings(body.get("findings", []))
        if e.status == 409 and "approval" in str(body.get("message", "")):
            typer.echo(f"ℹ️  Policy requires approval for breaking changes\n   Create approval request: "
                       f"prism schema approve-request --schema-file {file} --topic {topic}")
        raise typer.Exit(1) from None
    verb = "registered" if r["created"] else "already registered (idempotent)"
    typer.echo(f"✅ Schema {verb}: {r['schema_id']} ({topic} version {r['version']}{' ' + r['label'] if r['label'] else ''})")
    typer.echo(f"   URL: {r['schema_url']}\n   Hash: {r['hash']}")
    _print_findings(r["validation"]["warnings"])


@schema_app.command("list")
def list_(
    topic: Annotated[str | None, typer.Option("--topic", "--subject")] = None,
    namespace: Annotated[str | None, typer.Option()] = None,
    registry: RegistryOpt = DEFAULT_REGISTRY,
) -> None:
    """List subjects, or a subject's versions with status and active consumers."""
    import datetime as dt

    try:
        if topic is None:
            rows = _api(registry, "GET", "/v1/subjects" + (f"?namespace={_q(namespace)}" if namespace else ""))
            typer.echo(f"{'SUBJECT':40} {'NAMESPACE':16} {'LATEST':7} FORMAT")
            for r in rows:
                typer.echo(f"{r['subject']:40} {r['namespace']:16} v{r['latest_version']:<6} {r['format']}")
            return
        rows = _api(registry, "GET", f"/v1/subjects/{_q(topic)}/versions")
    except ApiError as e:
        _api_fail(e, f"--topic {topic}" if topic else "--namespace")
    typer.echo(f"{'VERSION':9} {'LABEL':8} {'STATUS':10} {'CONSUMERS':10} PUBLISHED")
    for r in rows:
        day = dt.datetime.fromtimestamp(r["created_at"], dt.UTC).date().isoformat()
        typer.echo(f"v{r['version']:<8} {r['label'] or '':8} {r['status']:10} {r['active_consumers']:<10} {day}")


@schema_app.command()
def get(
    topic: Annotated[str, typer.Option("--topic", "--subject")],
    version: Annotated[str, typer.Option()] = "latest",
    output: Annotated[Path | None, typer.Option(help="directory to write the schema file into")] = None,
    registry: RegistryOpt = DEFAULT_REGISTRY,
) -> None:
    """Print (or save) a schema version."""
    try:
        r = _api(registry, "GET", f"/v1/subjects/{_q(topic)}/versions/{_q(version)}")
    except ApiError as e:
        _api_fail(e, f"--topic {topic} --version {version}")
    if output is None:
        typer.echo(r["schema"], nl=False)
        return
    ext = {"PROTOBUF": "proto", "AVRO": "avsc", "JSON": "json"}[r["format"]]
    output.mkdir(parents=True, exist_ok=True)
    dest = output / f"{topic}.v{r['version']}.{ext}"
    dest.write_text(r["schema"], encoding="utf-8")
    typer.echo(f"✅ wrote {dest} ({r['hash']})")


def _report(result: Any, against: str) -> None:
    if result.is_compatible:
        typer.echo(f"✅ Compatible with {against} ({result.mode.value})")
    else:
        typer.echo(f"❌ NOT {result.mode.value.lower()} compatible with {against}")
    _print_findings([*result.breaking, *result.warnings])


@schema_app.command()
def check(
    topic: Annotated[str | None, typer.Option("--topic", "--subject", help="producer subject in the registry")] = None,
    consumer_schema: Annotated[Path | None, typer.Option("--consumer-schema", help="schema your consumer reads with")] = None,
    old: Annotated[Path | None, typer.Option(help="offline: previous schema file")] = None,
    new: Annotated[Path | None, typer.Option(help="offline: new schema file")] = None,
    mode: Annotated[str, typer.Option(help="backward|forward|full|*_transitive|none|strict")] = "backward",
    fmt: Annotated[str | None, typer.Option("--format")] = None,
    registry: RegistryOpt = DEFAULT_REGISTRY,
) -> None:
    """Compatibility check for CI. Exit 1 on breaking changes.

    Consumer mode (``--topic --consumer-schema``): can a consumer built with this schema read
    what the producer's latest version writes? Offline mode: ``--old A --new B --mode ...``.
    """
    m = _mode(mode)
    try:
        if old is not None and new is not None:
            f = _fmt(new, fmt)
            result = compat_check(f, _read(new), [(str(old), _read(old))], m)
            _report(result, str(old))
        elif topic and consumer_schema:
            try:
                producer = _api(registry, "GET", f"/v1/subjects/{_q(topic)}/versions/latest")
            except ApiError as e:
                _api_fail(e, f"--topic {topic}", exit_code=2)
            f = SchemaFormat.parse(producer["format"])
            label = producer.get("label") or f"v{producer['version']}"
            # "Can my consumer read the producer's data?" is a reader/writer question: the consumer
            # schema plays the OLD reader and the producer's latest the NEW writer, i.e. FORWARD.
            # (Running BACKWARD with the roles swapped would apply successor-version rules such as
            # "removed without reserved" to a consumer that simply ignores some fields.)
            swapped = {"BACKWARD": "FORWARD", "FORWARD": "BACKWARD", "BACKWARD_TRANSITIVE": "FORWARD",
                       "FORWARD_TRANSITIVE": "BACKWARD", "FULL_TRANSITIVE": "FULL"}.get(m.value, m.value)
            result = compat_check(f, producer["schema"], [("consumer schema", _read(consumer_schema))], swapped)
            _report(result, f"producer schema {label}")
        else:
            _fail("bad_usage", "nothing to compare", where="prism schema check",
                  fix="use --topic with --consumer-schema, or --old with --new")
    except SchemaError as e:
        _fail("invalid_schema", f"invalid schema: {e}", where=str(new or consumer_schema or ""),
              fix="fix the schema so that it parses")
    if not result.is_compatible:
        raise typer.Exit(1)


@schema_app.command()
def validate(
    file: Annotated[Path, typer.Option("--file", "-f")],
    against: Annotated[Path | None, typer.Option(help="previous version file (offline)")] = None,
    topic: Annotated[str | None, typer.Option("--topic", "--subject", help="check against the registry")] = None,
    check_backward: Annotated[bool, typer.Option("--check-backward")] = False,
    check_forward: Annotated[bool, typer.Option("--check-forward")] = False,
    check_full: Annotated[bool, typer.Option("--check-full")] = False,
    pii_policy: Annotated[str, typer.Option(help="enforce|warn|off")] = "warn",
    fmt: Annotated[str | None, typer.Option("--format")] = None,
    registry: RegistryOpt = DEFAULT_REGISTRY,
) -> None:
    """Validate a schema file: it parses, PII tags (per --pii-policy), and optionally compatibility."""
    f = _fmt(file, fmt)
    text = _read(file)
    try:
        from app.schema.compat import parse_schema

        parse_schema(f, text)
    except SchemaError as e:
        _fail("invalid_schema", f"invalid schema: {e}", where=str(file), fix="fix the schema so that it parses",
              exit_code=1)
    typer.echo(f"✅ {file} is a valid {f.value} schema")
    failed = False
    pii = check_policy(f, text, PiiPolicy.parse(pii_policy))
    if pii:
        _print_findings(pii)
        failed |= any(x.severity.value == "breaking" for x in pii)
    mode = "FULL" if check_full else "FORWARD" if check_forward else "BACKWARD" if check_backward else None
    if mode:
        if against is not None:
            result = compat_check(f, text, [(str(against), _read(against))], mode)
            _report(result, str(against))
        elif topic:
            try:
                res = _api(registry, "POST", f"/v1/subjects/{_q(topic)}/check",
                           {"schema": text, "format": f.value, "mode": mode})
            except ApiError as e:
                _api_fail(e, f"--topic {topic}", exit_code=2)
            ok = res["is_compatible"]
            typer.echo(f"{'✅' if ok else '❌ NOT'} {mode.lower()} compatible with {topic} (registry)")
            _print_findings([*res["breaking_changes"], *res["warnings"]])
            failed |= not ok
            result = None
        else:
            _fail("bad_usage", f"--check-{mode.lower()} needs something to compare with", where=f"--check-{mode.lower()}",
                  fix="add --against FILE (offline) or --topic SUBJECT (the registry)")
        if result is not None:
            failed |= not result.is_compatible
    if failed:
        raise typer.Exit(1)


@schema_app.command("audit")
def audit_cmd(
    check_pii: Annotated[bool, typer.Option("--check-pii")] = True,
    directory: Annotated[Path | None, typer.Option("--dir", help="audit schema files under a directory")] = None,
    registry: RegistryOpt = DEFAULT_REGISTRY,
) -> None:
    """PII audit over all schemas (registry or a directory). Exit 1 when any schema has untagged PII."""
    if directory is not None:
        if not directory.is_dir():  # rglob of a missing directory is empty: an audit of nothing, exit 0
            _fail("bad_input", "not a directory" if directory.exists() else "no such directory",
                  where=str(directory), fix="pass --dir DIRECTORY that holds .proto, .avsc or .json schema files")
        files = sorted(p for p in directory.rglob("*") if p.suffix in (".proto", ".avsc", ".json") and p.is_file())
        if not files:
            _fail("bad_input", "no schema files (.proto, .avsc, .json) under the directory", where=str(directory),
                  fix="pass --dir DIRECTORY that holds the schema files")
        entries = audit((str(p.relative_to(directory)), SchemaFormat.from_filename(p.name), _read(p))
                        for p in files)
        rows = [{"schema": e.label, "ok": e.ok, "untagged": list(e.untagged)} for e in entries]
    else:
        rows = _api(registry, "GET", "/v1/pii/audit")
    for r in rows:
        if r["ok"]:
            typer.echo(f"✅ {r['schema']}: All PII fields tagged")
        elif not r["untagged"]:  # not ok with nothing untagged: it did not parse (the label says why)
            typer.echo(f"❌ {r['schema']}")
        for p in r["untagged"]:
            typer.echo(f"❌ {r['schema']}: Field '{p.rsplit('.', 1)[-1]}' missing @prism.pii tag")
    if any(not r["ok"] for r in rows):
        raise typer.Exit(1)


def _policy_scope(namespace: str | None, subject: str | None, global_: bool, where: str) -> tuple[str, str]:
    """(``/v1/policies/{scope}`` key, label) of exactly one of --namespace/--subject/--global.

    ``ns:`` and ``subject:`` are explicit, so a name never means the other kind of scope (a
    plain name is a subject only once the registry knows it)."""
    given = [x for x in (namespace is not None, subject is not None, global_) if x]
    if len(given) != 1:
        _fail("bad_usage", "give exactly one policy scope", where=where,
              fix="pass --namespace NAME, --subject SUBJECT or --global")
    if global_ or namespace == "__global__":
        return "__global__", "global"
    if subject is not None:
        return f"subject:{subject}", f"subject {subject}"
    return f"ns:{namespace}", f"namespace {namespace}"


@policy_app.command("set")
def policy_set(
    namespace: Annotated[str | None, typer.Option(help="namespace scope")] = None,
    subject: Annotated[str | None, typer.Option(help="subject scope (wins over its namespace)")] = None,
    global_: Annotated[bool, typer.Option("--global", help="the global scope")] = False,
    compatibility: Annotated[str | None, typer.Option()] = None,
    require_schema: Annotated[bool | None, typer.Option(
        "--require-schema/--no-require-schema",
        help="topics of this scope must have a schema: workers reading them without one refuse to start, "
             "SDK publishes without a registered subject are refused (RFC-030 phase 2)")] = None,
    require_pii_tags: Annotated[bool | None, typer.Option(
        "--require-pii-tags/--no-require-pii-tags",
        help="every leaf field of a newly registered schema needs a PII tag; \"none\" is an explicit "
             "opt-out (RFC-030 phase 3)")] = None,
    pii_policy: Annotated[str | None, typer.Option(help="enforce|warn|off: untagged fields whose names look "
                                                        "personal")] = None,
    approval_required_for: Annotated[str | None, typer.Option("--approval-required-for",
                                                              help="'breaking' or 'none'")] = None,
    registry: RegistryOpt = DEFAULT_REGISTRY,
) -> None:
    """Set a namespace's, a subject's or the global policy (admin). Settings not given stay as they are."""
    scope, label = _policy_scope(namespace, subject, global_, "prism schema policy set")
    body = {"compatibility": _mode(compatibility).value if compatibility else None, "pii_policy": pii_policy,
            "approval_required": None if approval_required_for is None else approval_required_for == "breaking",
            "require_schema": require_schema, "require_pii_tags": require_pii_tags}
    try:
        r = _api(registry, "PUT", f"/v1/policies/{_q(scope)}", body)
    except ApiError as e:
        _api_fail(e, f"--{label.split()[0]}")
    typer.echo(f"✅ policy for {label}: {json.dumps(r)}")


@policy_app.command("get")
def policy_get(namespace: Annotated[str | None, typer.Option(help="namespace (or __global__)")] = None,
               subject: Annotated[str | None, typer.Option()] = None,
               global_: Annotated[bool, typer.Option("--global")] = False,
               registry: RegistryOpt = DEFAULT_REGISTRY) -> None:
    """Print the effective policy of a namespace, a subject or the global scope, with
    ``require_schema`` and ``require_pii_tags`` and where the compatibility setting comes from."""
    scope, _ = _policy_scope(namespace, subject, global_, "prism schema policy get")
    typer.echo(json.dumps(_api(registry, "GET", f"/v1/policies/{_q(scope)}"), indent=2))


@schema_app.command("approve-request")
def approve_request(
    schema_file: Annotated[Path, typer.Option("--schema-file")],
    topic: Annotated[str, typer.Option("--topic", "--subject")],
    reason: Annotated[str, typer.Option()] = "",
    fmt: Annotated[str | None, typer.Option("--format")] = None,
    registry: RegistryOpt = DEFAULT_REGISTRY,
) -> None:
    """Ask for approval of a breaking change (a different person approves with ``approve``)."""
    r = _api(registry, "POST", "/v1/approvals", {"subject": topic, "schema": _read(schema_file),
                                                 "format": _fmt(schema_file, fmt).value, "reason": reason})
    typer.echo(f"✅ approval request #{r['id']} created ({r['status']}); approve with: "
               f"prism schema approve --id {r['id']}")


@schema_app.command()
def approve(
    id: Annotated[int, typer.Option("--id")],
    reject: Annotated[bool, typer.Option("--reject")] = False,
    registry: RegistryOpt = DEFAULT_REGISTRY,
) -> None:
    """Approve (or --reject) an approval request."""
    try:
        r = _api(registry, "POST", f"/v1/approvals/{id}/{'reject' if reject else 'approve'}", {})
    except ApiError as e:
        _api_fail(e, f"--id {id}")
    typer.echo(f"✅ request #{id} {r['status']} by {r['decided_by']}")


@schema_app.command()
def codegen(
    output: Annotated[Path, typer.Option("--output", "-o")],
    file: Annotated[Path | None, typer.Option("--file", "-f")] = None,
    topic: Annotated[str | None, typer.Option("--topic", "--subject")] = None,
    version: Annotated[str, typer.Option()] = "latest",
    language: Annotated[str, typer.Option()] = "python",
    registry: RegistryOpt = DEFAULT_REGISTRY,
) -> None:
    """Generate Python code (``*_pb2.py`` + ``.pyi``) from a protobuf schema file or registry version."""
    if language.lower() not in ("python", "py"):
        _fail("bad_usage", f"language {language!r} is not supported", where="--language",
              fix="use --language python (the only one)")
    if file is not None:
        text, name = _read(file), file.name
    elif topic:
        r = _api(registry, "GET", f"/v1/subjects/{_q(topic)}/versions/{_q(version)}")
        if r["format"] != "PROTOBUF":
            _fail("bad_usage", f"{topic} version {version} is a {r['format']} schema; codegen supports protobuf only",
                  where=f"--topic {topic}", fix="pick a protobuf subject")
        text, name = r["schema"], topic.replace(".", "_").replace("-", "_") + ".proto"
    else:
        _fail("bad_usage", "no schema given", where="prism schema codegen", fix="pass --file FILE or --topic SUBJECT")
    try:
        written = generate_python(text, name, output)
    except SchemaError as e:
        _fail("invalid_schema", str(e), where=str(file) if file is not None else f"--topic {topic}",
              fix="fix the schema so that it compiles", exit_code=1)
    for p in written:
        typer.echo(f"✅ generated {p}")


def generate_python(text: str, filename: str, output: Path) -> list[Path]:
    """Run protoc's Python generator on one schema text; returns the written files.

    The schema is compiled first (same errors as registration). When it imports
    ``prism/annotations.proto``, that module is generated too, so the output directory is
    importable on its own (``from prism import annotations_pb2`` is what protoc emits).
    """
    import tempfile

    from grpc_tools import protoc

    from app.schema.protoparse import _PKG_PROTO, _call_capturing_stderr, _wkt_include, compile_proto

    compiled = compile_proto(text, filename)
    targets = [filename]
    if filename != "prism/annotations.proto" and any(f.name == "prism/annotations.proto" for f in compiled.files):
        targets.append("prism/annotations.proto")
    output.mkdir(parents=True, exist_ok=True)
    before = {p: p.stat().st_mtime_ns for p in output.rglob("*") if p.is_file()}
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / filename
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_text(text, encoding="utf-8")
        err = Path(tmp) / "err"
        args = ["protoc", f"-I{tmp}", f"-I{_PKG_PROTO}", f"-I{_wkt_include()}", f"--python_out={output}",
                f"--pyi_out={output}", *targets]
        if _call_capturing_stderr(lambda: protoc.main(args), err) != 0:
            raise SchemaError(err.read_text())
    return sorted(p for p in output.rglob("*") if p.is_file() and before.get(p) != p.stat().st_mtime_ns)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(schema_app())


#: Far above any password; a longer first line of stdin is not one.
MAX_PASSWORD_BYTES = 4096


def _stdin_line() -> str:
    """The first line of stdin, bounded and UTF-8: `--stdin < /dev/zero` read without end, and
    bytes that are not UTF-8 were a `UnicodeEncodeError` traceback when hashed."""
    raw = sys.stdin.buffer.readline(MAX_PASSWORD_BYTES + 1)
    if len(raw.rstrip(b"\r\n")) > MAX_PASSWORD_BYTES:
        _fail("bad_input", f"the first line of stdin is over {MAX_PASSWORD_BYTES} bytes", where="--stdin",
              fix="pipe the password alone, on one line (e.g. prism schema hash-password --stdin <<< \"$PASSWORD\")")
    try:
        return raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as e:
        _fail("bad_input", f"the password on stdin is not UTF-8 text (byte {e.start})", where="--stdin",
              fix="pipe UTF-8 text (check the terminal's or the file's encoding)")


def _terminal() -> bool:
    """Whether there is a terminal to ask for the password on without echo: stdin, or the
    controlling terminal getpass opens (`/dev/tty`) when stdin is a pipe."""
    if sys.stdin.isatty():
        return True
    try:
        with open("/dev/tty", "rb"):
            return True
    except OSError:
        return False


@schema_app.command("hash-password")
def hash_password_cmd(
    user: Annotated[str | None, typer.Option(help="also print a users-file entry for this user")] = None,
    roles: Annotated[str, typer.Option(help="roles for the entry: read, write, write:<prefix>, admin "
                                             "(comma-separated)")] = "read",
    stdin: Annotated[bool, typer.Option("--stdin", help="read the password from the first line of stdin")] = False,
) -> None:
    """Hash a password (Argon2id) for a registry / management API users file.

    The password is asked for twice without echo (or read from stdin with ``--stdin``),
    never taken from the command line, where shell history and ``ps`` would keep it."""
    from app.errors import ConfigError
    from app.security.http_auth import hash_password, parse_roles

    try:
        role_set = parse_roles(roles, where="--roles")
    except ConfigError as e:
        fail(e)
    if not stdin and not _terminal():
        # getpass without a terminal warns that the password may be echoed, reads the pipe, then
        # ends in "Aborted." - three lines and a Python warning instead of the one error line
        _fail("no_terminal", "no terminal to ask for the password on", where="stdin",
              fix="pipe it instead: prism schema hash-password --stdin <<< \"$PASSWORD\"")
    # the prompt on stderr, so `prism schema hash-password --user u >> users.yaml` writes only the entry
    password = _stdin_line() if stdin else typer.prompt("password", hide_input=True, confirmation_prompt=True,
                                                        err=True)
    if len(password) < 12:
        _fail("weak_password", "the password is shorter than 12 characters", where="password",
              fix="use a long random one (e.g. python -c 'import secrets; print(secrets.token_urlsafe(24))')")
    digest = hash_password(password)
    if user is None:
        typer.echo(digest)
        return
    typer.echo(f"- user: {json.dumps(user)}\n  hash: {json.dumps(digest)}\n  roles: {json.dumps(sorted(role_set))}")


def _check_tls(certfile: Path | None, keyfile: Path | None) -> None:
    """Load the certificate and key now, so a wrong path or a key that does not match the
    certificate stops the start-up with a message instead of failing every handshake."""
    import ssl

    from app.errors import ConfigError

    if certfile is None and keyfile is None:
        return
    if certfile is None or keyfile is None:
        raise ConfigError("TLS needs both a certificate and its key",
                          path="--ssl-keyfile" if keyfile is None else "--ssl-certfile",
                          hint="pass both --ssl-certfile and --ssl-keyfile")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(str(certfile), str(keyfile))
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"cannot load the TLS certificate and key: {e}", path=f"{certfile} / {keyfile}",
                          hint="pass a PEM certificate (chain) and its unencrypted PEM private key") from None


def start_line(*, host: str, port: int, tls: bool, workers: int, store: str, auth: Any) -> str:
    """``prism registry listening on URL, store STORE, auth MODES, N worker(s)``; the store URL
    without its password (a PostgreSQL URL may carry one)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(store)
    if parts.password is not None:
        netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        store = urlunsplit(parts._replace(netloc=netloc))
    modes = [m for m, on in (("basic", bool(auth.users)), ("bearer-jwt", auth.bearer is not None)) if on]
    if auth.anonymous_roles:
        modes.append(f"anonymous={','.join(sorted(auth.anonymous_roles))}")
    shown = f"[{host}]" if ":" in host else host
    return (f"prism registry listening on {'https' if tls else 'http'}://{shown}:{port}, store {store}, "
            f"auth {'+'.join(modes) or 'none'}, {workers} worker(s)")


@schema_app.command()
def serve(
    host: Annotated[str, typer.Option(help="interface to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port")] = 8081,
    workers: Annotated[int, typer.Option(min=1, help="worker processes sharing the port (one per core)")] = 1,
    store: Annotated[str | None, typer.Option(
        "--store", envvar="PRISM_REGISTRY_DB",
        help="sqlite:///path.db (default sqlite:///prism-registry.db) or postgresql://host/db[?schema=name]")] = None,
    users_file: Annotated[Path | None, typer.Option(
        "--users-file", envvar="PRISM_REGISTRY_USERS_FILE",
        help="YAML/JSON users file: user, Argon2 hash (prism schema hash-password), roles")] = None,
    jwt_config: Annotated[Path | None, typer.Option(
        "--jwt-config", envvar="PRISM_REGISTRY_JWT_CONFIG",
        help="YAML: jwks_file, issuers, audience, roles_claim, role_map (bearer JWTs)")] = None,
    allow_anonymous: Annotated[str | None, typer.Option(
        "--allow-anonymous", envvar="PRISM_REGISTRY_ALLOW_ANONYMOUS",
        help="roles for requests without credentials, e.g. read (default: none)")] = None,
    ssl_certfile: Annotated[Path | None, typer.Option("--ssl-certfile", help="PEM certificate: serve HTTPS")] = None,
    ssl_keyfile: Annotated[Path | None, typer.Option("--ssl-keyfile", help="PEM private key of --ssl-certfile")] = None,
) -> None:
    """Run the registry service (uvicorn with uvloop and httptools).

    Every request is authenticated (``--users-file`` for HTTP basic, ``--jwt-config`` for
    bearer JWTs) and authorized by role; ``--allow-anonymous read`` lets requests without
    credentials read. With none of the three the registry refuses to start.

    With ``--workers N`` the N processes share the port and the store. Each keeps its own
    read caches; a write through any of them reaches the others' caches through the store
    (SQLite ``data_version``, PostgreSQL ``NOTIFY``), and ``/metrics`` adds up all of them
    (prometheus_client's multiprocess mode, in a directory made for this run).
    """
    import shutil
    import tempfile

    from app.schema.authz import ENV_ALLOW_ANONYMOUS, ENV_JWT_CONFIG, ENV_USERS_FILE, registry_auth_from_env
    from app.schema.service import MAX_BODY_BYTES
    from app.schema.store import open_store
    from app.security.http_limits import HttpLimits, bind_listen, serve, uvicorn_config

    # Authentication settings are validated here, before anything listens; the worker
    # processes uvicorn starts read the same settings from the environment.
    auth_env = {ENV_USERS_FILE: str(users_file.resolve()) if users_file else "",
                ENV_JWT_CONFIG: str(jwt_config.resolve()) if jwt_config else "",
                ENV_ALLOW_ANONYMOUS: allow_anonymous or ""}
    from app.cli.output import ProblemCollector

    # Every problem at once, one line each (it stopped at the first: a missing users file hid a
    # bad TLS pair and a port out of range); the port is bound last, and closed again on failure.
    found = ProblemCollector()
    auth = found.attempt(registry_auth_from_env, auth_env)
    # the workers read the same variables
    limits = found.attempt(HttpLimits.from_env, max_body_bytes=MAX_BODY_BYTES)
    found.attempt(_check_tls, ssl_certfile, ssl_keyfile)
    sock = found.attempt(bind_listen, host, port)
    if found.problems and sock is not None:
        sock.close()
    found.raise_if_any()
    assert auth is not None and limits is not None and sock is not None
    if auth.accepts_credentials and ssl_certfile is None and host not in ("127.0.0.1", "::1", "localhost"):
        typer.echo(f"⚠️  serving credentials over plain HTTP on {host}: pass --ssl-certfile/--ssl-keyfile "
                   "or terminate TLS in front of the registry", err=True)
    os.environ.update(auth_env)
    # Fail fast on a bad store URL, and create the tables once here rather than in N
    # workers at the same moment (concurrent CREATE SCHEMA can fail on PostgreSQL).
    try:
        open_store(store).close()
    except Exception as e:
        _fail("bad_store", f"cannot open registry store {store or 'sqlite:///prism-registry.db'!r}: {e}",
              where="--store", fix="check the URL (--store / PRISM_REGISTRY_DB) and that the database is reachable")
    if store:
        os.environ["PRISM_REGISTRY_DB"] = store
    # one start line (the registry logged nothing at start): where it listens, the store, the auth modes
    typer.echo(start_line(host=host, port=port, tls=ssl_certfile is not None, workers=workers,
                          store=store or "sqlite:///prism-registry.db", auth=auth), err=True)
    metrics_dir = None
    if workers > 1 and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        metrics_dir = tempfile.mkdtemp(prefix="prism-registry-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    try:
        # The protocol is uvicorn's httptools one with the HTTP limits of every Prism server.
        serve(uvicorn_config("app.schema.service:app", limits, host=host, port=port, workers=workers, loop="uvloop",
                             log_level="warning", access_log=False,
                             ssl_certfile=str(ssl_certfile) if ssl_certfile else None,
                             ssl_keyfile=str(ssl_keyfile) if ssl_keyfile else None), sock)
    finally:
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)

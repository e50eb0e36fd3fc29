"""``prism console``: run the operator console (uvicorn)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from app.cli.output import friendly

console_app = typer.Typer(help="The operator console in the browser.", invoke_without_command=True)


@console_app.callback()
@friendly
def console(
    registry: Annotated[str | None, typer.Option(
        "--registry", envvar="PRISM_CONSOLE_REGISTRY_URL",
        help="schema registry URL; the console's credentials: PRISM_REGISTRY_USER/_PASSWORD or _TOKEN")] = None,
    worker: Annotated[list[str] | None, typer.Option(
        "--worker", envvar="PRISM_CONSOLE_WORKER_URLS",
        help="worker (or supervisor) management API URL(s), comma-separated or repeated; credentials: "
             "PRISM_ADMIN_USER/_PASSWORD or _TOKEN")] = None,
    broker: Annotated[str | None, typer.Option(
        "--broker", help="Kafka bootstrap for the DLQ pages (default: PRISM_BROKER_URL, else the local "
                         "`prism broker`); PRISM_SECURITY_PROTOCOL / PRISM_SASL_* apply")] = None,
    users_file: Annotated[Path | None, typer.Option(
        "--users-file", envvar="PRISM_CONSOLE_USERS_FILE",
        help="YAML/JSON users file (prism schema hash-password): read role views, admin replays")] = None,
    jwt_config: Annotated[Path | None, typer.Option(
        "--jwt-config", envvar="PRISM_CONSOLE_JWT_CONFIG", help="bearer JWTs for scripted (read) access")] = None,
    audit_keyring: Annotated[Path | None, typer.Option(
        "--audit-keyring", envvar="PRISM_CONSOLE_AUDIT_KEYRING",
        help="signing keyring holding the key the console signs its audit records with (withheld DLQ views)")] = None,
    audit_key: Annotated[str | None, typer.Option(
        "--audit-key", envvar="PRISM_CONSOLE_AUDIT_KEY",
        help="id of that key; its publisher_id is the principal the records name")] = None,
    host: Annotated[str, typer.Option(help="interface to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port")] = 8090,
    ssl_certfile: Annotated[Path | None, typer.Option("--ssl-certfile", help="PEM certificate: serve HTTPS")] = None,
    ssl_keyfile: Annotated[Path | None, typer.Option("--ssl-keyfile", help="PEM key of --ssl-certfile")] = None,
) -> None:
    """Run the operator console: pipelines, DLQ browsing and replay, subjects, PII, approvals,
    policies and the audit log. Every page needs a log-in (--users-file); it refuses to start
    without users."""
    import os

    from app.cli.output import ProblemCollector
    from app.console.settings import ConsoleSettings
    from app.console.web import create_app
    from app.errors import ConfigError
    from app.security.http_auth import auth_from_settings
    from app.security.http_limits import bind_listen, serve, uvicorn_config

    # Every setting is checked and every problem reported in one run (one line each), as `prism
    # run` does: the console stopped at the first (no users file hid a bad worker URL, a bad CA
    # file and a bad audit keyring).
    found = ProblemCollector()
    if users_file is None:
        found.problems.append(ConfigError(
            "the console needs its users", path="--users-file",
            hint="make one with `prism schema hash-password` (docs/operations.md, Console); roles: read to view, "
                 "admin to replay"))
    if (ssl_certfile is None) != (ssl_keyfile is None):
        found.problems.append(ConfigError("--ssl-certfile and --ssl-keyfile go together", path="--ssl-certfile",
                                          hint="pass both (a PEM certificate and its key) or neither"))
    auth = None if users_file is None else found.attempt(
        auth_from_settings, users_file=users_file, jwt_config=jwt_config, allow_anonymous=None,
        realm="prism-console", where="--users-file")
    bootstrap, broker_settings = None, None
    if broker or (os.environ.get("PRISM_BROKER_URL") or "").strip():
        from app.broker.admin import BrokerSettings

        broker_settings = found.attempt(BrokerSettings.from_env,
                                        {**os.environ, "PRISM_BROKER_URL": broker} if broker else None)
        bootstrap = broker_settings.bootstrap if broker_settings is not None else None
    else:
        from app.broker.local import find_running

        running = find_running()
        bootstrap = running.bootstrap if running is not None else None
    env = {**os.environ, **({"PRISM_CONSOLE_AUDIT_KEYRING": str(audit_keyring)} if audit_keyring else {}),
           **({"PRISM_CONSOLE_AUDIT_KEY": audit_key} if audit_key else {})}
    settings = found.attempt(ConsoleSettings.from_env, auth, registry_url=registry, worker_urls=worker or [],
                             bootstrap=bootstrap, broker_settings=broker_settings, env=env)
    sock = found.attempt(bind_listen, host, port)  # last: nothing is left bound when another check failed
    if found.problems and sock is not None:
        sock.close()
    found.raise_if_any()
    assert settings is not None and sock is not None
    if ssl_certfile is None and host not in ("127.0.0.1", "::1", "localhost"):
        typer.echo(f"⚠️  serving log-ins over plain HTTP on {host}: pass --ssl-certfile/--ssl-keyfile or "
                   "terminate TLS in front of the console", err=True)
    typer.echo(f"prism console on http{'s' if ssl_certfile else ''}://{host}:{port}: registry "
               f"{settings.registry_url or 'none'}, workers {', '.join(settings.worker_urls) or 'none'}, broker "
               f"{bootstrap or 'none'}", err=True)
    serve(uvicorn_config(create_app(settings), settings.http_limits, host=host, port=port, log_level="warning",
                         ssl_certfile=str(ssl_certfile) if ssl_certfile else None,
                         ssl_keyfile=str(ssl_keyfile) if ssl_keyfile else None), sock)

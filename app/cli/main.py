"""`prism` - the command line. Every command validates its inputs first and reports
problems as one clear line (what, where, how to fix) with exit code 2, never a traceback."""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import json
import os
import re
import socket
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from app.cli.output import friendly as _friendly
from app.errors import ConfigError

app = typer.Typer(help="Prism: uniform, signed, validated pub/sub envelopes (RFC-031).", no_args_is_help=True,
                  pretty_exceptions_enable=False)
envelope_app = typer.Typer(help="Inspect, validate and convert envelopes.", no_args_is_help=True)
dlq_app = typer.Typer(help="Dead-letter topics.", no_args_is_help=True)
topics_app = typer.Typer(help="Topic administration.", no_args_is_help=True)
app.add_typer(envelope_app, name="envelope")
app.add_typer(dlq_app, name="dlq")
app.add_typer(topics_app, name="topics")


def _mount_keys_and_broker() -> None:
    from app.cli.broker import broker_app
    from app.cli.keys import keys_app

    app.add_typer(keys_app, name="keys")
    app.add_typer(broker_app, name="broker")


_mount_keys_and_broker()

console = Console(emoji=False)
err_console = Console(stderr=True, emoji=False)
F = TypeVar("F", bound=Callable[..., Any])
DEFAULT_TOPOLOGY = Path("topologies/orders-created.yaml")


def friendly(fn: F) -> F:
    """Turn Prism's typed errors into one readable line and exit code 2 (app/cli/output.py)."""
    return _friendly(fn)


def _mount_optional() -> None:
    """Sub-apps owned by other packages; mounted when importable."""
    for module, attr, name in (("app.schema.cli", "schema_app", "schema"), ("app.lake.cli", "lake_app", "lake"),
                               ("app.console.cli", "console_app", "console")):
        try:
            mod = __import__(module, fromlist=[attr])
        except ImportError:
            continue
        app.add_typer(getattr(mod, attr), name=name)


# --------------------------------------------------------------------------- run / demo


_HOSTNAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")


def _check_web_bind(value: str) -> None:
    """An interface address or host name, refused before anything starts (not a bind error later)."""
    try:
        ipaddress.ip_address(value)
        return
    except ValueError:
        pass
    if not _HOSTNAME.fullmatch(value) or value.rsplit(".", 1)[-1].isdigit():  # 300.1.1.1 is a bad address
        raise ConfigError(f"--web-bind {value!r} is neither an IP address nor a host name", path="--web-bind",
                          hint="use 0.0.0.0 (every interface, e.g. in a container), 127.0.0.1 or a host name")


@app.command()
@friendly
def run(
    topology: Annotated[Path, typer.Option("--topology", "-t", help="topology YAML file")] = DEFAULT_TOPOLOGY,
    data_dir: Annotated[Path, typer.Option(help="RocksDB tables and broker logs")] = Path("var/data"),
    web_port: Annotated[int | None, typer.Option(help="Faust web port (metrics, health)")] = None,
    web_bind: Annotated[str, typer.Option(
        envvar="PRISM_WEB_BIND",
        help="interface the web port listens on; 0.0.0.0 in a container, so the orchestrator's probes reach it")
    ] = "127.0.0.1",
    loglevel: Annotated[str, typer.Option(help="worker log level")] = "warning",
    dev_keys: Annotated[bool, typer.Option(
        "--dev-keys/--no-dev-keys",
        help="create throwaway development keys where the topology expects keys, if missing (a try-out on one "
             "machine; other workers will not share them). Without it a worker without keys refuses to start: "
             "make a shared key set with `prism keys init`")] = False,
    processes: Annotated[int, typer.Option(
        "--processes", "-p", min=1, max=256,
        help="worker processes in one consumer group (like Kafka Connect's tasks.max); >1 runs a supervisor "
             "that restarts crashed workers (docs/operations.md)")] = 1,
    processing_guarantee: Annotated[str | None, typer.Option(
        "--processing-guarantee", envvar="PRISM_PROCESSING_GUARANTEE",
        help="at_least_once (the default) or exactly_once: each batch's outputs, DLQ records, dedup changelog "
             "and input offsets in one Kafka transaction; consumers read with isolation.level=read_committed "
             "(docs/operations.md). Overrides the topology's processing_guarantee")] = None,
    replace_topology: Annotated[bool, typer.Option(
        "--replace-topology", envvar="PRISM_REPLACE_TOPOLOGY",
        help="join the consumer group even though its live members run another version of this topology (a "
             "rollout that restarts every member); without it such a start is refused (docs/operations.md, "
             "\"One topology per consumer group\")")] = False,
) -> None:
    """Run the pipeline worker for a topology (long-running; SIGTERM stops it cleanly).

    Without PRISM_BROKER_URL it uses the local broker of `prism broker start` when one runs, else it
    starts a private embedded broker that stops with the worker. Every configuration problem
    (topology, environment, keys, web settings) is reported at once, before any broker is touched."""
    from app.broker.admin import BrokerSettings, ensure_topics
    from app.broker.embedded import EmbeddedBroker, find_free_port
    from app.cli.output import ProblemCollector
    from app.security.devkeys import check_topology_keys
    from app.topology import load_topology
    from app.worker.faust_app import check_loglevel, run_worker, use_uvloop
    from app.worker.observe import Observer
    from app.worker.pipeline import PipelineApp

    use_uvloop()  # first: the Faust app built below binds the event loop that exists then
    # Every check that does not need another's result runs, and all their problems are reported
    # together (one error line each): an operator fixes them in one round, not one per start.
    found = ProblemCollector()
    found.attempt(_check_web_bind, web_bind)
    found.attempt(check_loglevel, loglevel)
    topo = found.attempt(load_topology, topology)
    settings = found.attempt(BrokerSettings.from_env)
    if topo is not None and not dev_keys:
        found.attempt(check_topology_keys, topo, topology)
    if topo is not None:  # RFC-030 phase 2: the registry's require_schema (app/worker/schema_policy.py)
        from app.worker.schema_policy import check_schema_policy

        found.attempt(check_schema_policy, topo)
    from app.worker.limits import max_request_from_env

    # PRISM_MAX_REQUEST_BYTES: this process's pipeline uses the value checked here; the children
    # of --processes N inherit the variable and read it with the same function (app_from_env)
    max_request = found.attempt(max_request_from_env)
    from app.worker.lag import lag_settings_from_env

    found.attempt(lag_settings_from_env)  # the lag monitor reads them once the worker runs
    size_overrides: dict[str, Any] = {} if max_request is None else {"producer_max_request_size": max_request}
    from app.worker.transactions import EXACTLY_ONCE, GUARANTEE_ENV, check_guarantee, check_transactions, refusal

    guarantee = found.attempt(check_guarantee, processing_guarantee or (topo.processing_guarantee if topo else
                                                                         "at_least_once"),
                              # where the value came from: typer reads the variable for the option
                              where=GUARANTEE_ENV if processing_guarantee is not None
                              and os.environ.get(GUARANTEE_ENV) == processing_guarantee else "--processing-guarantee")
    management = observer = None
    writer_id: str | None = None
    shard: Any = None
    if processes > 1:
        from app.worker.management import ManagementSettings

        # The children read PRISM_ADMIN_* / PRISM_WEB_SSL_* themselves: a bad value is reported
        # here once, before any broker, not as N workers crash-looping.
        management = found.attempt(ManagementSettings.from_env)
        found.attempt(_check_ports, web_port, processes)
        from app.worker.archive_service import WRITER_ID_ENV, check_writer_id

        if os.environ.get(WRITER_ID_ENV, "").strip():  # each child appends -p<i>: the base must be valid
            found.attempt(check_writer_id, os.environ[WRITER_ID_ENV].strip() + "-p0")
    else:
        from app.worker.archive_service import SHARD_ENV, check_writer_id, default_writer_id, parse_shard

        # metrics, health and the management API on --web-port; tracing per PRISM_TRACES_EXPORTER
        found.attempt(_check_web_port, web_port, web_bind)
        observer = found.attempt(Observer.from_env)
        writer_id = found.attempt(lambda: check_writer_id(default_writer_id()))
        shard = found.attempt(parse_shard, os.environ.get(SHARD_ENV))
    found.raise_if_any()
    assert topo is not None and settings is not None
    if dev_keys:
        _dev_keys_for(topo, topology)
    local = None
    if settings.embedded:
        from app.broker.local import find_running

        local = find_running()
    # Everything else that can be wrong in configuration (key contents, JWKS, schema) is checked
    # by building the pipeline BEFORE any broker is touched: the config error, not a connection error.
    port = None if not settings.embedded or local is not None else find_free_port()
    bootstrap = settings.bootstrap if not settings.embedded else local.bootstrap if local is not None \
        else f"127.0.0.1:{port}"
    if guarantee == EXACTLY_ONCE:  # never a silent downgrade: no transactions, no start (one line)
        if settings.embedded:
            raise ConfigError(refusal("the embedded broker has none"), path="--processing-guarantee")
        check_transactions(bootstrap, f"prism-{topo.name}", settings)
    os.environ[GUARANTEE_ENV] = str(guarantee)  # what the children of --processes N run with
    checked = None  # the supervisor's validation-only pipeline (--processes)
    if processes > 1:
        from app.worker.supervisor import child_data_dir

        # validation only (keys, JWKS, schema, archive settings): the children build their own
        checked = PipelineApp(topo, bootstrap=bootstrap, data_dir=child_data_dir(data_dir, topo.name, 0),
                              embedded=settings.embedded, broker_settings=None if settings.embedded else settings,
                              processing_guarantee=guarantee, **size_overrides)
        supervisor = _supervisor(topology, topo, processes=processes, bootstrap=bootstrap, embedded=settings.embedded,
                                 data_dir=data_dir, web_port=web_port, loglevel=loglevel, web_bind=web_bind,
                                 management=management)
        pipeline = None
    else:
        pipeline = PipelineApp(topo, bootstrap=bootstrap, data_dir=data_dir / topo.name, embedded=settings.embedded,
                               web_port=web_port, broker_settings=None if settings.embedded else settings,
                               archive_location=topo.archive.path, archive_writer_id=writer_id, archive_shard=shard,
                               observe=observer, processing_guarantee=guarantee, **size_overrides,
                               # web_host names this worker in `status` (worker_id): the pod's hostname
                               # when listening on every interface
                               web_bind=web_bind, web_host=socket.gethostname() if web_bind in ("0.0.0.0", "::")
                               else web_bind)
    broker = None
    if local is not None:
        console.print(f"using the {escape(local.describe())}: it keeps the topics (and the DLQ) after this worker "
                      "stops; set PRISM_BROKER_URL to use a Kafka cluster", soft_wrap=True)
    elif settings.embedded:
        broker = EmbeddedBroker(port=port, log_dir=data_dir / "broker").start()
        console.print(f"embedded broker on {bootstrap}, private to this worker: its topics (the DLQ too) are gone "
                      "when it stops; `prism broker start` runs one that outlives workers, or set PRISM_BROKER_URL "
                      "to use a Kafka cluster", soft_wrap=True)
    try:
        if not settings.embedded:  # a real cluster: auth and TLS first, one line, no retry loop
            from app.broker.preflight import plan_for, preflight

            preflight(settings)
        asyncio.run(ensure_topics(bootstrap, topo.topics(), settings=None if settings.embedded else settings,
                                  configs=topo.topic_configs()))
        if not settings.embedded:  # then the ACLs (the topics exist now); the supervisor checks once for all
            preflight(settings, plan_for(pipeline if pipeline is not None else checked))
        # topics' size limits that leave an input no room: one error line now (app/worker/limits.py)
        (pipeline if pipeline is not None else checked).check_write_room()
        # one policy per consumer group: never join members that run another topology
        from app.worker.group_topology import check_group_topology, topology_digest

        asyncio.run(check_group_topology(bootstrap, f"prism-{topo.name}", topology_digest(topo),
                                         settings=None if settings.embedded else settings,
                                         replace=replace_topology, topology_path=str(topology)))
        if pipeline is None:
            from app.worker.supervisor import supervise

            console.print(f"supervisor (pid {os.getpid()}) starting {processes} workers for topology "
                          f"[bold]{escape(topo.name)}[/]" + (f"; status on {'https' if supervisor.management.ssl_context else 'http'}://127.0.0.1:{web_port}/workers"
                          if web_port else "")
                          + f"; state in {supervisor.status_file}")
            raise typer.Exit(asyncio.run(supervise(supervisor, web_port=web_port)))
        console.print(f"worker for topology [bold]{escape(topo.name)}[/] reading "
                      f"{escape(str([s.topic for s in topo.sources]))}")
        run_worker(pipeline.app, loglevel=loglevel)
    finally:
        if broker is not None:
            broker.stop()


def _dev_keys_for(topo: Any, topology_file: Path) -> None:
    """`--dev-keys`: create the missing key files where the topology expects them, once, in this
    process - so the children of `--processes N` all read this one set - and say that they are
    throwaway keys no other worker shares."""
    from app.security.devkeys import check_topology_keys, display_path, ensure_dev_keys, topology_key_files

    missing = {f: p for f, p in topology_key_files(topo).items() if not p.exists()}
    for folder in sorted({p.parent for p in missing.values()}):
        ensure_dev_keys(folder)
        console.print(f"[yellow]warning[/] --dev-keys: created throwaway development keys in {escape(str(display_path(folder)))}; "
                      "workers on other machines or containers will not trust what this one signs - use `prism keys "
                      "init` for a key set the group shares", soft_wrap=True)
    check_topology_keys(topo, topology_file)  # a topology naming other file names than the dev set


def _check_web_port(web_port: int | None, web_bind: str = "127.0.0.1") -> None:
    """`--web-port` is a TCP port and free on `--web-bind` now: checked with the other settings,
    before any topic is created or broker started (a bad one was an 80-line Faust traceback, a
    busy one a 62-line OSError after the worker had created its topics)."""
    if web_port is None:
        return
    if not 1 <= web_port <= 65535:
        raise ConfigError(f"--web-port {web_port} is not a TCP port", path="--web-port",
                          hint="use a port from 1 to 65535 (e.g. 6066), or leave it out for no web server")
    with socket.socket(socket.AF_INET6 if ":" in web_bind else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the web server binds it
        try:
            s.bind((web_bind, web_port))
        except OSError as exc:
            busy = exc.errno == errno.EADDRINUSE
            raise ConfigError(f"port {web_port} on {web_bind} is {'in use' if busy else 'not available'}"
                              + ("" if busy else f" ({exc.strerror})"), path="--web-port",
                              hint=f"pick another --web-port, or stop what listens there (ss -ltnp 'sport = :{web_port}')"
                              if busy else "check --web-bind names an address of this machine") from None


def _check_ports(web_port: int | None, processes: int) -> None:
    """The supervisor's port and its children's (web_port + 1 + i) must be free now."""
    import socket

    from app.errors import ConfigError

    if web_port is None:
        return
    if web_port < 1:
        raise ConfigError(f"--web-port {web_port} is not a TCP port", path="--web-port",
                          hint="use a port from 1 to 65535 (e.g. 6066), or leave it out for no web server")
    if web_port + processes > 65535:
        raise ConfigError(f"--web-port {web_port} leaves no room for {processes} worker ports above it",
                          path="--web-port", hint="the children use web-port+1 .. web-port+N; pick a lower port")
    for p in range(web_port, web_port + processes + 1):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                raise ConfigError(f"port {p} is in use", path="--web-port",
                                  hint=f"the supervisor uses {web_port} and its workers {web_port + 1}.."
                                       f"{web_port + processes}; pick another --web-port") from None


def _supervisor(topology_file: Path, topo: Any, *, processes: int, bootstrap: str, embedded: bool, data_dir: Path,
                web_port: int | None, loglevel: str, web_bind: str = "127.0.0.1", management: Any = None) -> Any:
    """The supervisor of `prism run --processes N` (validated, nothing started yet)."""
    from app.worker.supervisor import Supervisor

    env = {"PRISM_TOPOLOGY": str(topology_file.resolve()), "PRISM_BOOTSTRAP": bootstrap,
           "PRISM_APP_ID": f"prism-{topo.name}", "PRISM_EMBEDDED": "1" if embedded else "0",
           "PRISM_ARCHIVE": str(Path(topo.archive.path).resolve()) if topo.archive.enabled else ""}
    from app.worker.archive_service import WRITER_ID_ENV

    if os.environ.get(WRITER_ID_ENV, "").strip():
        env[WRITER_ID_ENV] = os.environ[WRITER_ID_ENV].strip()  # each child appends -p<i>
    most = max(s.partitions for s in topo.sources)
    if processes > most:
        console.print(f"[yellow]warning[/] {processes} processes for at most {most} partitions per source topic: "
                      f"{processes - most} will hold no source partition (standbys for a rebalance)")
    return Supervisor(processes=processes, topology_name=topo.name, data_dir=data_dir, env=env, web_port=web_port,
                      web_bind=web_bind, loglevel=loglevel, management=management)


@app.command()
@friendly
def demo(
    topology: Annotated[Path, typer.Option("--topology", "-t")] = DEFAULT_TOPOLOGY,
    messages: Annotated[int, typer.Option("--messages", "-n", min=1, help="how many messages to publish")] = 5000,
    rate: Annotated[float, typer.Option(min=0, help="messages per second (0: as fast as possible)")] = 0.0,
    data_dir: Annotated[Path, typer.Option()] = Path("var/demo"),
    seed: Annotated[int, typer.Option(help="load generator seed")] = 7,
    lake: Annotated[bool, typer.Option(help="archive and compact into a Delta table with local Spark")] = True,
    json_out: Annotated[Path | None, typer.Option("--json", help="also write the report as JSON")] = None,
) -> None:
    """Broker + worker + a realistic mix of producers (some deliberately bad); prints where
    every message went and fails (exit 1) if any message is unaccounted for."""
    from app.demo.runner import print_report, run_demo
    from app.topology import load_topology
    from app.worker.faust_app import use_uvloop

    topo = load_topology(topology)
    if json_out is not None:
        _check_output_file(json_out, "--json")
    use_uvloop()
    report = asyncio.run(run_demo(topo, messages=messages, rate=rate, data_dir=data_dir,
                                  keys_dir=Path("var/dev-keys"), console=console, seed=seed, lake=lake))
    print_report(report, topo, console)
    if json_out is not None:
        json_out.write_text(json.dumps({"published": report.published, "worker": report.worker,
                                        "topics": dict(report.topic_counts), "mismatches": report.mismatches,
                                        "lake": report.lake, "seconds": report.seconds}, indent=2))
    raise typer.Exit(0 if report.ok else 1)


def _check_output_file(path: Path, option: str) -> None:
    """A file the command will write at its end, checked at its start: `prism demo --json /tmp`
    ran the whole demo (broker, worker, 5,000 messages) and only then failed to write its report."""
    if path.is_dir():
        raise ConfigError(f"{option} {str(path)!r} is a directory", path=option,
                          hint=f"name a file, e.g. {option} report.json")
    parent = path.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise ConfigError(f"{option} {str(path)!r}: cannot write in {str(parent)!r} "
                          f"({'no such directory' if not parent.exists() else 'not a writable directory'})",
                          path=option, hint="name a file in an existing directory this user can write")


# --------------------------------------------------------------------------- envelope tools


def _read_input(path: str) -> bytes:
    """At most one byte over the envelope size limit, so the decoder refuses a larger input
    as too large - and `/dev/zero` or an endless pipe is not read until memory runs out."""
    from app.envelope.codec import DEFAULT_LIMITS

    most = DEFAULT_LIMITS.max_message_bytes + 1
    if path == "-":
        return sys.stdin.buffer.read(most)
    from app.config_files import open_for_reading

    try:
        with open_for_reading(path) as f:  # a named pipe without a writer: empty, not a hang
            return f.read(most)
    except OSError as exc:
        raise typer.BadParameter(f"cannot read {path}: {exc.strerror}") from None


_LOOSE_HELP = "LNMP input: loose decoding (ignore or recover a malformed LNMP envelope, with warnings)"


@envelope_app.command("inspect")
@friendly
def envelope_inspect(path: Annotated[str, typer.Argument(help="file with one envelope or LNMP message, or - for stdin")],
                     payload: Annotated[bool, typer.Option(help="include the payload")] = False,
                     loose: Annotated[bool, typer.Option("--loose", help=_LOOSE_HELP)] = False) -> None:
    """Print an envelope (either layout) or an LNMP message (binary or text) as JSON. Auth tokens are shown redacted."""
    from app.cli import lnmp_inspect
    from app.cli.envelope_view import envelope_doc

    data = _read_input(path)
    if lnmp_inspect.is_lnmp(data):
        reading = lnmp_inspect.read(data, source=path, strict=not loose)
        console.print_json(json.dumps(lnmp_inspect.inspect_doc(reading, payload=payload)))
        return
    console.print_json(json.dumps(envelope_doc(data, payload=payload)))


@envelope_app.command("validate")
@friendly
def envelope_validate(path: Annotated[str, typer.Argument(help="file with one envelope or LNMP message, or - for stdin")],
                      loose: Annotated[bool, typer.Option("--loose", help=_LOOSE_HELP)] = False) -> None:
    """Check required fields and metadata sanity (LNMP: the LNMP rules and metadata sanity); exit 1 listing every problem."""
    from app.cli import lnmp_inspect
    from app.envelope import decode, required_problems, sanity_problems

    data = _read_input(path)
    if lnmp_inspect.is_lnmp(data):
        reading = lnmp_inspect.read(data, source=path, strict=not loose)
        fails, warns = lnmp_inspect.problems(reading)
        for w in warns:
            console.print(f"[yellow]![/] {escape(w)}", soft_wrap=True)
        if fails:
            for f in fails:
                console.print(f"[red]✗[/] {escape(f)}", soft_wrap=True)
            raise typer.Exit(1)
        console.print(f"[green]✓[/] {escape(lnmp_inspect.summary(reading))}", soft_wrap=True)
        return
    env = decode(data)
    problems = required_problems(env) + sanity_problems(env)
    if problems:
        for p in problems:
            console.print(f"[red]✗[/] {escape(str(p))}", soft_wrap=True)
        raise typer.Exit(1)
    console.print(f"[green]✓[/] valid envelope {escape(env.message_id)}")


@envelope_app.command("convert")
@friendly
def envelope_convert(
    path: Annotated[str, typer.Argument(help="file with one envelope, or - for stdin")],
    to: Annotated[str, typer.Option("--to", help="draft (RFC-031, .v2) or reviewed (memo-031, .v3)")],
    output: Annotated[Path, typer.Option("--output", "-o", help="where to write the converted envelope")],
) -> None:
    """Convert between the draft and reviewed layouts; reports anything that could not be carried."""
    from app.envelope import Layout, convert

    try:
        layout = Layout(to)
    except ValueError:
        raise typer.BadParameter("--to must be 'draft' or 'reviewed'") from None
    out, dropped = convert(_read_input(path), layout)
    output.write_bytes(out)
    console.print(f"wrote {len(out)} bytes ({layout.value} layout) to {escape(str(output))}")
    for d in dropped:
        console.print(f"[yellow]dropped[/] {escape(str(d))}", soft_wrap=True)


# --------------------------------------------------------------------------- topics / dlq


def _bootstrap() -> tuple[str, Any]:
    """PRISM_BROKER_URL, else the running local broker (`prism broker start`), said on stderr."""
    from app.broker.local import cli_bootstrap

    return cli_bootstrap(lambda line: err_console.print(line, markup=False, highlight=False, soft_wrap=True))


@topics_app.command("create")
@friendly
def topics_create(
    topology: Annotated[Path, typer.Option("--topology", "-t")] = DEFAULT_TOPOLOGY,
    source_retention: Annotated[str | None, typer.Option(
        help="retention of the source topics (e.g. 1h, 30m, 2d); default: each source's `retention` "
             "(24h). Source records carry producer tokens: keep them only as long as needed")] = None,
) -> None:
    """Create every topic a topology reads or writes, with its declared partition count.

    Source topics get a short `retention.ms` (memo-031 Recommendation 5: tokens in ingress
    topics are kept only as long as needed). Existing topics are not altered; an existing
    source topic that keeps records longer is reported with the command that fixes it."""
    from app.broker.admin import check_retention, ensure_topics
    from app.errors import ConfigError
    from app.topology import MIN_SOURCE_RETENTION_MS, load_topology, parse_duration_ms

    topo = load_topology(topology)
    override = None
    if source_retention is not None:
        try:
            override = parse_duration_ms(source_retention)
        except ValueError as exc:
            raise ConfigError(str(exc), path="--source-retention", hint="write e.g. 30m, 1h, 2d") from None
        if override < MIN_SOURCE_RETENTION_MS:
            raise ConfigError(f"{source_retention!r} is under one minute", path="--source-retention",
                              hint="records could be deleted before the worker reads them")
    from app.cli.dlq import LEDGER_CONFIGS, ledger_topics

    bootstrap, settings = _bootstrap()
    configs = topo.topic_configs(source_retention_ms=override)
    # the DLQ replay ledgers too (compacted, app/cli/dlq.py), so a replay needs no create ACL
    ledgers = ledger_topics(topo)
    topics = {**topo.topics(), **ledgers}
    states = asyncio.run(ensure_topics(bootstrap, topics, settings=settings,
                                       configs={**configs, **{name: LEDGER_CONFIGS for name in ledgers}}))
    for name, state in sorted(states.items()):
        extra = f", retention.ms={configs[name]['retention.ms']}" if name in configs and state == "created" else ""
        extra += ", cleanup.policy=compact" if name in ledgers and state == "created" else ""
        console.print(f"{state:>8}  {name} ({topics[name]} partitions{extra})", markup=False, highlight=False)
    limits = {name: int(cfg["retention.ms"]) for name, cfg in configs.items() if states.get(name) == "exists"}
    for c in asyncio.run(check_retention(bootstrap, limits, settings=settings)):
        if c.status == "too_long":
            kept = "forever" if (c.actual_ms or 0) < 0 else f"retention.ms={c.actual_ms}"
            console.print(f"warning  {c.topic} exists and keeps records {kept}, longer than {c.limit_ms} ms; fix: "
                          f"kafka-configs --alter --entity-type topics --entity-name {c.topic} "
                          f"--add-config retention.ms={c.limit_ms}", markup=False, soft_wrap=True)
        elif c.status != "ok":
            console.print(f"   note  could not check the retention of {c.topic}: {c.detail}", markup=False, soft_wrap=True)


@dlq_app.command("replay")
@friendly
def dlq_replay(
    topology: Annotated[Path, typer.Option("--topology", "-t")] = DEFAULT_TOPOLOGY,
    reason: Annotated[str | None, typer.Option(help="only records with this prism.errors.reason")] = None,
    record: Annotated[list[str] | None, typer.Option(
        "--record", metavar="P@O", help="only this DLQ record, PARTITION@OFFSET as `prism dlq list` prints it "
                                       "(repeatable)")] = None,
    range_: Annotated[list[str] | None, typer.Option(
        "--range", metavar="P@FIRST-LAST", help="only the DLQ records of partition P from offset FIRST to LAST, "
                                                "both included (repeatable)")] = None,
    source: Annotated[str | None, typer.Option(
        help="only this source topic's DLQ (needed with --record/--range when the topology has several)")] = None,
    limit: Annotated[int, typer.Option(min=0, help="at most this many records (0: all)")] = 0,
    dry_run: Annotated[bool, typer.Option(help="only show what would be replayed; write nothing")] = False,
    force: Annotated[bool, typer.Option(
        help="replay records the ledger lists as replayed already (each is reported as forced)")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="the report as JSON")] = False,
) -> None:
    """Re-inject DLQ records into their source topic after a fix: same partition, same key, error
    headers removed; each at most once, unless --force (ledger: <dlq topic>.replayed).

    Records whose headers name another source topic, a partition the source lacks, or that were
    cut to fit the DLQ are never replayed (docs/operations.md, "DLQ replay")."""
    from app.cli.dlq import choose_sources, parse_selection, print_report, replay
    from app.topology import load_topology

    topo = load_topology(topology)
    # selectors are checked before any broker is contacted
    for s in choose_sources(topo, source, bool(record or range_)):
        parse_selection(record or [], range_ or [], s.partitions, s.topic + topo.dlq.topic_suffix)
    bootstrap, settings = _bootstrap()
    report = asyncio.run(replay(topo, bootstrap, settings=settings, reason=reason, records=record or [],
                                ranges=range_ or [], source=source, limit=limit, dry_run=dry_run, force=force,
                                console=err_console))
    if json_out:
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        print_report(report, console)


_built = False


def build_app() -> typer.Typer:
    """The whole `prism` command tree, sub-apps mounted once. `main` runs it; tests parse
    deployment manifests' command lines with it (tests/deploy), so those can't drift."""
    global _built
    if not _built:
        _mount_optional()
        from app.cli.migrate import register
        from app.cli.ops import register as register_ops

        register(envelope_app)  # prism envelope migrate | check-compat
        register_ops(app, dlq_app)  # prism status, prism dlq list | show
        from app.cli.migrate_status import migrate_app

        app.add_typer(migrate_app, name="migrate")  # prism migrate status (the .v2 sunset)
        from app.cli.audit import register as register_audit

        register_audit(app)  # prism audit
        from app.cli.output import friendly_everywhere

        friendly_everywhere(app)  # the mounted sub-apps' commands too: one error line, never a traceback
        _built = True
    return app


#: Commands that run for long and log like a service: aiokafka's own log lines stay theirs.
_SERVICES = frozenset({"run", "demo", "console", "broker"})


def _one_line_usage_errors() -> None:
    """Click's usage errors (a missing option, a bad value, an unknown command) as the one
    `error [usage] ... fix:` line every CLI failure is, instead of typer's boxed panel of 5+
    lines. Typer renders them through `rich_utils.rich_format_error` (looked up at call time),
    and plain click through `ClickException.show`; both print this line now."""
    import click
    import typer.rich_utils

    def one_line(e: click.ClickException, file: object = None) -> None:
        ctx = getattr(e, "ctx", None)
        where = ctx.command_path if ctx is not None else "prism"
        message = " ".join(e.format_message().split())
        if type(e).__name__ == "NoArgsIsHelpError":
            # a bare group (`prism keys`): typer has printed the group's help already and the
            # exception's own message is that (empty) rendering - say what is missing instead.
            # Typer vendors its own click, so the group is found by what it does, not its class.
            list_commands = getattr(ctx.command, "list_commands", None) if ctx is not None else None
            names = list_commands(ctx) if list_commands is not None else []
            message = "missing command" + (f" (one of: {', '.join(names)})" if names else "")
        print(f"error [usage] {message} (at {where}); fix: see `{where} --help`", file=sys.stderr)

    def aborted() -> None:
        # typer's "Aborted." when a prompt's input ends (Ctrl-D, a closed stdin): the error line too
        print("error [aborted] the input ended before the command had what it asked for (at prism); fix: run it "
              "again and answer the prompt, or give the input as its --help says (e.g. --stdin)", file=sys.stderr)

    typer.rich_utils.rich_format_error = one_line  # type: ignore[assignment]
    typer.rich_utils.rich_abort_error = aborted  # type: ignore[assignment]
    click.ClickException.show = one_line  # type: ignore[method-assign]


def _undecodable(text: str) -> bool:
    """Python decodes argv and the environment with `surrogateescape`: a byte that is not UTF-8
    is a lone surrogate in the `str`, which every later encode (a socket address, a URL, a
    database, a file name in JSON) refuses with a `UnicodeEncodeError` traceback."""
    return any("\udc80" <= c <= "\udcff" for c in text)


def _shown(text: str) -> str:
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _refuse_undecodable_input(argv: list[str], environ: Mapping[str, str]) -> None:
    """Arguments and PRISM_* variables that are not UTF-8 text, refused once, here, as the one
    `error [usage]` line - not wherever each command happens to encode them first (it was a
    traceback from `prism dlq list`, `prism lake stats`, `prism status --group`, `prism schema`
    with such a PRISM_BROKER_URL, path, group name or registry URL)."""
    for i, arg in enumerate(argv, start=1):
        if _undecodable(arg):
            print(f"error [usage] argument {i} ('{_shown(arg)}') is not UTF-8 text (at prism); fix: pass UTF-8 "
                  "text (check the shell's locale and where the value came from)", file=sys.stderr)
            raise SystemExit(2)
    for name in sorted(environ):
        if name.startswith("PRISM_") and (_undecodable(name) or _undecodable(environ[name])):
            print(f"error [usage] environment variable {_shown(name)} ('{_shown(environ[name])}') is not UTF-8 text "
                  f"(at {_shown(name)}); fix: set it to UTF-8 text, or unset it", file=sys.stderr)
            raise SystemExit(2)


def main() -> None:
    _refuse_undecodable_input(sys.argv[1:], os.environ)
    build_app()
    _one_line_usage_errors()
    os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
    if len(sys.argv) > 1 and sys.argv[1] not in _SERVICES:
        # a one-shot command reports a broker failure as its one error line; aiokafka's
        # "Unable connect to ..." ERROR lines before it would make it several
        import logging

        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    app()


if __name__ == "__main__":
    main()

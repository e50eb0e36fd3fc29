"""`prism broker start|status|stop`: the local broker that outlives workers (app/broker/local.py).

Why: the DLQ workflow ("fix, restart the worker, replay") needs the DLQ to survive the worker
restart, and `prism dlq` needs a broker it can find. A worker's private embedded broker has
neither property; this one runs detached on a known port until `prism broker stop`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from app.cli.output import friendly

broker_app = typer.Typer(help="A local embedded broker that outlives workers (for the DLQ workflow).",
                         no_args_is_help=True)
console = Console(highlight=False, emoji=False)
StateDir = Annotated[Path | None, typer.Option(
    "--state-dir", "--data-dir", envvar="PRISM_BROKER_STATE_DIR",
    help="pid, port and log files of the local broker (default var/broker); its topics live in its memory")]


@broker_app.command("start")
@friendly
def start(
    port: Annotated[int, typer.Option(min=1, max=65535, help="listener port on 127.0.0.1")] = 9092,
    state_dir: StateDir = None,
) -> None:
    """Start the local broker in the background on PORT; it runs until `prism broker stop`.

    Its data is in memory: it lasts as long as the broker process. `prism run`, `prism dlq` and
    `prism topics create` use it when PRISM_BROKER_URL is not set."""
    from app.broker import local

    broker, started = local.start(port, state_dir)
    if not started:
        console.print(f"already running: {broker.describe()}", markup=False)
        return
    console.print(f"started the {broker.describe()}; log {broker.log_path}", markup=False, soft_wrap=True)
    console.print("its topics live in its memory until `prism broker stop`; `prism run`, `prism dlq` and "
                  "`prism topics create` use it while PRISM_BROKER_URL is unset", markup=False, soft_wrap=True)


@broker_app.command("status")
@friendly
def status(state_dir: StateDir = None,
           json_out: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False) -> None:
    """Whether the local broker runs, on which port, with which pid (exit 3 when it does not)."""
    from app.broker import local

    running, stale = local.probe(state_dir)
    folder = local.state_dir(state_dir)
    if json_out:
        doc = {"running": running is not None, "state_dir": str(folder)}
        if running is not None:
            doc |= {"bootstrap": running.bootstrap, "port": running.port, "pid": running.pid,
                    "log": str(running.log_path)}
        elif stale is not None:
            doc |= {"stale_pid": stale.pid, "stale_port": stale.port}
        typer.echo(json.dumps(doc, indent=2))
    elif running is not None:
        console.print(f"running: {running.describe()}; log {running.log_path}", markup=False, soft_wrap=True)
    elif stale is not None:
        console.print(f"not running (stale record in {folder}: pid {stale.pid} on port {stale.port} is gone; "
                      "`prism broker start` replaces it)", markup=False, soft_wrap=True)
    else:
        console.print(f"not running (no local broker recorded in {folder}; start one with `prism broker start`)",
                      markup=False, soft_wrap=True)
    if running is None:
        raise typer.Exit(3)


@broker_app.command("stop")
@friendly
def stop(state_dir: StateDir = None) -> None:
    """Stop the local broker (its topics are gone with it)."""
    from app.broker import local

    rec, was_running = local.stop(state_dir)
    if rec is None:
        console.print("not running (nothing recorded)", markup=False)
    elif was_running:
        console.print(f"stopped the local broker on {rec.bootstrap} (pid {rec.pid}); its topics are gone",
                      markup=False)
    else:
        console.print(f"not running (removed the stale record of pid {rec.pid} on port {rec.port})", markup=False)

"""Rendering the cluster manifests (deploy/) the way `kubectl apply -k` does, and reading the
`prism` command lines in them with the CLI's own parser."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.main
import yaml

from tests.support import require

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
#: Typer vendors its own click; its UsageError is what a bad command line raises.
UsageError: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


def kubectl() -> str:
    """kubectl's built-in kustomize renders the manifests exactly as `kubectl apply -k` will."""
    path = shutil.which("kubectl")
    require(path is not None, "kubectl (its built-in kustomize renders deploy/): apt-get install kubectl")
    assert path is not None
    return path


def render(kustomization_dir: Path) -> list[dict[str, Any]]:
    res = subprocess.run([kubectl(), "kustomize", str(kustomization_dir)], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, f"kubectl kustomize {kustomization_dir} failed:\n{res.stderr}"
    return [d for d in yaml.safe_load_all(res.stdout) if d]


@pytest.fixture(scope="session")
def base() -> list[dict[str, Any]]:
    return render(DEPLOY / "base")


@pytest.fixture(scope="session")
def overlay() -> list[dict[str, Any]]:
    return render(DEPLOY / "overlays" / "example")


def find(objs: list[dict[str, Any]], kind: str, name_prefix: str) -> dict[str, Any]:
    """The one object of `kind` whose name starts with `name_prefix` (generated names carry a hash)."""
    hits = [o for o in objs if o["kind"] == kind and o["metadata"]["name"].startswith(name_prefix)]
    assert len(hits) == 1, f"expected one {kind} {name_prefix}*, found {[o['metadata']['name'] for o in hits]}"
    return hits[0]


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    if obj["kind"] == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return obj["spec"]["template"]["spec"]


def container(obj: dict[str, Any], name: str) -> dict[str, Any]:
    (c,) = [c for c in pod_spec(obj)["containers"] if c["name"] == name]
    return c


def parse_prism(argv: Sequence[str]) -> tuple[list[str], dict[str, Any]]:
    """Parse a `prism ...` command line with the real CLI: (command path, parsed parameters).

    Raises UsageError (typer.BadParameter is one) for an unknown command, flag or bad value, exactly
    as the container would fail at start."""
    from app.cli.main import build_app

    assert argv and argv[0] == "prism", f"not a prism command line: {argv}"
    cmd: Any = typer.main.get_command(build_app())
    args, path = list(argv[1:]), []
    while hasattr(cmd, "commands"):  # a command group
        assert args, f"{' '.join(['prism', *path])} needs a subcommand"
        name, args = args[0], args[1:]
        sub = cmd.get_command(typer.Context(cmd), name)
        if sub is None:
            raise UsageError(f"no such command {name!r} under prism {' '.join(path)}")
        path.append(name)
        cmd = sub
    ctx = cmd.make_context("prism " + " ".join(path), args)
    return path, dict(ctx.params)


def command_line(c: dict[str, Any]) -> list[str]:
    return [*c.get("command", []), *c.get("args", [])]


# --------------------------------------------------------------------------- what Prometheus sees

#: Labels Prometheus puts on every scraped series through the ServiceMonitor (deploy/monitoring):
#: the dashboard's pod/instance variables and the alert rules use them, the code never exports them.
SCRAPE_TARGET_LABELS = frozenset({"job", "instance", "namespace", "pod", "service", "endpoint", "container"})
#: kube-state-metrics series the lake panels and alerts read (the CronJob exports nothing itself),
#: with their labels as kube-state-metrics v2 exports them.
KUBE_STATE_METRICS: dict[str, frozenset[str]] = {
    "kube_cronjob_status_last_successful_time": frozenset({"namespace", "cronjob"}),
    "kube_job_status_failed": frozenset({"namespace", "job_name", "reason"}),
    "kube_job_status_succeeded": frozenset({"namespace", "job_name"}),
    "kube_job_status_active": frozenset({"namespace", "job_name"}),
    "kube_pod_container_resource_limits": frozenset({"namespace", "pod", "uid", "container", "node", "resource",
                                                     "unit"}),
}


def archive_metrics() -> dict[str, set[str]]:
    """The archive tap's families (app/observability/archive_metrics.py) as a worker exports them."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from app.observability.archive_metrics import ArchiveCollector

    registry = CollectorRegistry()
    registry.register(ArchiveCollector(lambda: None))
    out: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        out[fam.name + ("_total" if fam.type == "counter" else "")] = set()
    return out


def as_scraped(exported: dict[str, set[str]]) -> dict[str, set[str]]:
    """Series names -> labels as Prometheus stores them: every exported series with the target
    labels, `up` (Prometheus' own, per target), and kube-state-metrics' series."""
    out = {name: set(labels) | SCRAPE_TARGET_LABELS for name, labels in exported.items()}
    out["up"] = set(SCRAPE_TARGET_LABELS)
    for name, labels in KUBE_STATE_METRICS.items():
        out[name] = set(labels) | SCRAPE_TARGET_LABELS
    return out

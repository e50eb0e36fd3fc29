"""docker-compose.yml runs the image the Dockerfile builds, and starts services in health order.

Why: the compose file used to start ``python:3.11-slim`` and apt-get/pip-install Prism on every
start (minutes, needs the network, not what gets deployed). These checks keep it on the built
image, with a healthcheck for every service and ``depends_on`` waiting for health, so
``docker compose up`` brings the worker up only once Kafka, the stores and the registry answer.
No Docker engine is needed: the file is parsed and checked against the Dockerfile.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "localhost/prism:latest"
INSTALL_AT_START = re.compile(r"\b(pip3?|apt-get|apt|apk|easy_install|uv)\s+(install|update|add)\b|-m\s+venv\b")


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(doc, dict) and isinstance(doc.get("services"), dict), "docker-compose.yml has no services"
    return doc["services"]


def _prism_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: svc for name, svc in services.items() if str(svc.get("image", "")).startswith("localhost/prism")}


def _argv(svc: dict[str, Any], key: str) -> list[str]:
    value = svc.get(key) or []
    return value.split() if isinstance(value, str) else [str(v) for v in value]


def _dockerfile_stages() -> set[str]:
    text = (ROOT / "Dockerfile").read_text()
    return {m.group(1) for m in re.finditer(r"(?im)^FROM\s+\S+\s+AS\s+(\S+)\s*$", text)}


def test_worker_and_registry_run_the_built_image(services: dict[str, dict[str, Any]]) -> None:
    prism = _prism_services(services)
    assert {"prism", "registry"} <= set(prism), f"services on {IMAGE}: {sorted(prism)}"
    stages = _dockerfile_stages()
    for name, svc in prism.items():
        assert svc["image"] == IMAGE, name
        build = svc.get("build")
        assert isinstance(build, dict) and build.get("context") == ".", f"{name}: build from the repository root"
        assert build.get("target", "worker") in stages, f"{name}: target {build.get('target')!r} not in {stages}"
        assert "BASE_IMAGE" in (build.get("args") or {}), f"{name}: the base image must stay selectable"


def test_nothing_is_installed_or_bind_mounted_at_start(services: dict[str, dict[str, Any]]) -> None:
    assert INSTALL_AT_START.search("sh -c 'apt-get update && pip install -e .'")  # the check itself bites
    for name, svc in _prism_services(services).items():
        started = " ".join(_argv(svc, "command") + _argv(svc, "entrypoint"))
        assert not INSTALL_AT_START.search(started), f"{name} installs at start: {started}"
        assert "sh" not in _argv(svc, "command")[:1], f"{name}: run prism directly (the image's ENTRYPOINT)"
        for volume in svc.get("volumes") or []:
            source = str(volume).split(":", 1)[0]
            assert not source.startswith((".", "/")), f"{name} bind-mounts {source}: the code comes from the image"
    assert not any(str(svc.get("image", "")).startswith("python:") for svc in services.values())


def _one_shot(services: dict[str, dict[str, Any]]) -> set[str]:
    """Jobs that run to completion before others start (`prism keys init`): no healthcheck, no restart."""
    return {name for name, svc in services.items() if str(svc.get("restart")) == "no"}


def test_every_service_has_a_healthcheck(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        if name in _one_shot(services):
            assert not svc.get("healthcheck"), f"{name} runs once; waiters use service_completed_successfully"
            continue
        check = svc.get("healthcheck") or {}
        test = check.get("test")
        assert test and not check.get("disable"), f"{name} has no healthcheck"
        assert isinstance(test, list) and test[0] in ("CMD", "CMD-SHELL"), f"{name}: healthcheck {test!r}"


def test_prism_healthchecks_probe_the_ports_the_commands_open(services: dict[str, dict[str, Any]]) -> None:
    worker, registry = services["prism"], services["registry"]
    argv = _argv(worker, "command")
    assert argv[:1] == ["run"], argv
    web_port = argv[argv.index("--web-port") + 1]
    probe = " ".join(worker["healthcheck"]["test"])
    assert f"127.0.0.1:{web_port}/readyz" in probe, f"the worker's healthcheck must ask /readyz on {web_port}: {probe}"

    argv = _argv(registry, "command")
    assert argv[:2] == ["schema", "serve"], argv
    port = argv[argv.index("--port") + 1]
    assert argv[argv.index("--host") + 1] == "0.0.0.0", "the registry must listen beyond the container's loopback"
    assert f"127.0.0.1:{port}/readyz" in " ".join(registry["healthcheck"]["test"]), "an open route, no credentials"
    # the registry refuses to start without authentication settings; anonymous callers may read, no more
    assert "--allow-anonymous" in argv and argv[argv.index("--allow-anonymous") + 1] == "read", argv


def test_depends_on_waits_for_health(services: dict[str, dict[str, Any]]) -> None:
    worker_deps = services["prism"].get("depends_on") or {}
    assert {"kafka", "registry", "keys"} <= set(worker_deps), worker_deps  # keys: one set, made before the worker
    for name, svc in services.items():
        deps = svc.get("depends_on") or {}
        assert isinstance(deps, dict), f"{name}: depends_on must name a condition per service"
        for dep, spec in deps.items():
            assert dep in services, f"{name} depends on unknown service {dep}"
            if dep in _one_shot(services):
                assert spec == {"condition": "service_completed_successfully"}, f"{name} -> {dep}: {spec}"
                continue
            assert spec == {"condition": "service_healthy"}, f"{name} -> {dep}: {spec}"
            assert services[dep].get("healthcheck"), f"{name} waits for {dep}, which has no healthcheck"


def test_the_published_management_port_reaches_the_worker(services: dict[str, dict[str, Any]]) -> None:
    """Compose (and `podman run -p 6066:6066`) publishes the worker's port; the worker must listen
    on every interface inside the container for that to reach it. The image says so once
    (PRISM_WEB_BIND=0.0.0.0 in the runtime stage, which the lake stage inherits); no command
    overrides it back to loopback."""
    text = (ROOT / "Dockerfile").read_text()
    runtime = text[text.index("AS runtime"):]
    assert re.search(r"(?m)^\s+PRISM_WEB_BIND=0\.0\.0\.0\s*$", runtime.split("\nFROM ", 1)[0]), \
        "the runtime stage must set PRISM_WEB_BIND=0.0.0.0"
    worker = services["prism"]
    assert "6066:6066" in [str(p) for p in worker.get("ports", [])]
    assert "--web-bind" not in _argv(worker, "command") or "0.0.0.0" in _argv(worker, "command")

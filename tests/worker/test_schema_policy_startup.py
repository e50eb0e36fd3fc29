"""RFC-030 "Migration Path" phase 2 at the worker: a topology that reads a namespace whose
registry policy has `require_schema` and has no schema itself does not start - one error line,
collected with the other start-up problems (`prism run` against a real registry)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from app.errors import ConfigError
from app.schema.registry import Registry
from app.schema.store import SqliteStore
from app.security.http_auth import auth_from_settings
from app.topology import Topology, load_topology
from app.worker.schema_policy import check_schema_policy, namespaces_read
from tests.cli.test_cli_errors import VALID, prism
from tests.schema.conftest import serve_registry
from tests.support import USERS, write_users_file


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[tuple[str, Registry]]:
    reg = Registry(SqliteStore(str(tmp_path / "registry.db")))
    auth = auth_from_settings(users_file=write_users_file(tmp_path / "users.yaml"), jwt_config=None,
                              allow_anonymous=None, realm="prism-schema-registry", where="tests")
    try:
        with serve_registry(reg, auth) as url:
            yield url, reg
    finally:
        reg.store.close()


def _doc(*, schema: bool, extra: dict | None = None) -> dict:
    doc = yaml.safe_load(VALID)
    doc["stages"] = [s for s in doc["stages"] if "enrich" not in s]
    doc["validation"] = "off"  # the registry's require_schema is under test, not the shipped `validation: warn`
    if schema:
        doc["stages"].append({"enrich": {"schema": {"registry_type": "file", "path": "schemas/x.proto"}}})
    doc.update(extra or {})
    return doc


def _topology(tmp_path: Path, name: str = "topology.yaml", **kw: object) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(_doc(**kw)))  # type: ignore[arg-type]
    return path


def _load(tmp_path: Path, name: str, **kw: object) -> Topology:
    return load_topology(_topology(tmp_path, name, **kw))


def _env(url: str) -> dict[str, str]:
    return {"PRISM_REGISTRY_URL": url, "PRISM_REGISTRY_USER": "reader", "PRISM_REGISTRY_PASSWORD": USERS["reader"][0],
            "PRISM_REGISTRY_TOKEN": ""}


def test_namespaces_a_topology_reads(tmp_path: Path) -> None:
    topo = _load(tmp_path, "t.yaml", schema=False, extra={
        "namespaces": {"legacy-imports": {"validation": "off"}},
        "producers": [{"principals": ["svc-*"], "namespaces": ["billing"], "topics": ["orders.created"]}]})
    assert namespaces_read(topo) == {"order-events": ["orders.created"], "billing": ["orders.created"],
                                     "legacy-imports": ["orders.created"]}


def test_run_refuses_with_the_other_startup_problems(registry: tuple[str, Registry], tmp_path: Path) -> None:
    url, reg = registry
    reg.set_policy(actor="admin", namespace="order-events", require_schema=True)
    topo = _topology(tmp_path, schema=False)
    res = prism("run", "--topology", str(topo), "--data-dir", str(tmp_path / "d"), "--loglevel", "loud",
                env={**_env(url), "PRISM_BROKER_URL": "127.0.0.1:1"})
    out = res.stdout + res.stderr
    assert res.returncode == 2 and "Traceback" not in out, out
    lines = [line for line in res.stderr.splitlines() if line.startswith("error [")]
    schema_lines = [line for line in lines if "requires a schema" in line]
    assert len(schema_lines) == 1, out
    line = schema_lines[0]
    assert "'order-events' (read from orders.created)" in line and "stages.enrich.schema" in line
    assert "prism schema policy set --namespace order-events --no-require-schema" in line
    assert any("--loglevel" in line for line in lines) and "configuration problems; nothing was started" in out
    assert not (tmp_path / "d").exists()


def test_the_check_passes_with_a_schema_without_the_policy_or_without_a_registry(
        registry: tuple[str, Registry], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url, reg = registry
    for k, v in _env(url).items():  # the registry credentials come from the process environment
        monkeypatch.setenv(k, v)
    with_schema = _load(tmp_path, "a.yaml", schema=True)
    without = _load(tmp_path, "b.yaml", schema=False)
    env = _env(url)
    check_schema_policy(without, env=env)  # no policy yet
    reg.set_policy(actor="admin", namespace="order-events", require_schema=True)
    check_schema_policy(with_schema, env={"PRISM_REGISTRY_URL": "http://127.0.0.1:1"})  # not even asked
    check_schema_policy(without, env={})  # no registry configured: nothing to check against
    with pytest.raises(ConfigError, match="requires a schema"):
        check_schema_policy(without, env=env)
    # the policy can come from the global scope too, and a namespace opt-out wins over it
    reg.set_policy(actor="admin", namespace="order-events", require_schema=False)
    check_schema_policy(without, env=env)
    reg.set_policy(actor="admin", require_schema=True)
    check_schema_policy(without, env=env)
    other = _load(tmp_path, "c.yaml", schema=False, extra={"namespace": "shipping"})
    with pytest.raises(ConfigError, match="'shipping'"):
        check_schema_policy(other, env=env)


def test_an_unreadable_policy_refuses_to_start(tmp_path: Path) -> None:
    """Told where the registry is but unable to read it: the worker cannot know, so it does not start."""
    without = _load(tmp_path, "t.yaml", schema=False)
    with pytest.raises(ConfigError, match="cannot read the schema policy") as e:
        check_schema_policy(without, env={"PRISM_REGISTRY_URL": "http://127.0.0.1:1"})
    assert e.value.path == "PRISM_REGISTRY_URL"
